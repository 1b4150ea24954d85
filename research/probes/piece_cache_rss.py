"""Resident bytes per token the tokenizer's piece cache keeps when full, as the process's RSS sees it.

    python -m research.probes.piece_cache_rss [--tokens 2000000] [--seed 1]

Why: the soak found the piece cache (tokenize/pieces.py) filling slowly toward its bound, and its cost per token
sets what that bound costs (loadaware/memory_budget.py, PIECE_CACHE_BYTES_PER_TOKEN). tests/unit/test_memory_costs.py
measures it with tracemalloc; this measures RSS. Texts are 400 random words with numbers (~5 characters a token),
each encoded twice (a piece is cached on its second sighting); token ids are spread over a 151k vocabulary, as a
large model's are, so most are above 256; they are the vocabulary's shared ints, as the tokenizer's are
(tokenize/shared_ids.py), so a cached list holds references only. Run it from a
checkout to measure that checkout's cache.
"""

from __future__ import annotations

import argparse
import gc
import random
from collections.abc import Sequence

from loadaware.tokenize.pieces import ChunkedEncoder
from loadaware.tokenize.shared_ids import SharedIds

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma")


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m research.probes.piece_cache_rss", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=2_000_000, help="fill the cache to this many token ids")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)

    shared = SharedIds(151_000)  # the tokenizer's table, made before the base reading: a fixed cost of its own

    def encode(text: str) -> list[int]:
        return shared([rng.randrange(300, 151_000) for _ in range(max(1, len(text) // 5))])

    encoder = ChunkedEncoder(encode, max_cached_tokens=10**12)
    gc.collect()
    base = rss_bytes()
    while encoder.cached_tokens < args.tokens:
        text = " ".join(rng.choice(WORDS) + str(rng.randrange(10**6)) for _ in range(400))
        encoder.encode(text)
        encoder.encode(text)
    gc.collect()
    grown = rss_bytes() - base
    print(f"{grown / encoder.cached_tokens:.1f} B a token (RSS +{grown / 2**20:.1f} MiB over "
          f"{encoder.cached_tokens:,} cached tokens)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
