"""What a piece-cache hit costs now that each piece's ids are an `array('i')` rather than a list of ints, paired.

    python -m research.probes.piece_cache_hit [--kb 64] [--rounds 9] [--repeat 50]

Why: the array keeps 4 bytes a token where a list kept an int object per id (docs/memory.md), but a hit now makes
those int objects again when the ids are copied out into the prompt's list. Two encoders hold the same cached
pieces of one text of `--kb` KiB (the sidecar's tokenized head is 64 KiB: --tokenize-max-chars), one as arrays (the
shipped cache) and one with every entry turned back into a list; the two encode the text in turn, round after
round (a busy machine slows both alike). Printed: each one's median over the rounds of the best of `--repeat`
encodes' mean, and the ratio. Token ids are spread over a 151k vocabulary (~5 characters a token), as a large
model's are, so most are above 256 and are not Python's cached small ints.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence

from loadaware.tokenize.pieces import ChunkedEncoder

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma")


def fake_encode(text: str) -> list[int]:
    """Ids that depend on the text only (a piece encodes the same every time), ~5 characters a token."""
    rng = random.Random(text)
    return [rng.randrange(300, 151_000) for _ in range(max(1, len(text) // 5))]


def cached(text: str, as_lists: bool) -> ChunkedEncoder:
    encoder = ChunkedEncoder(fake_encode, max_cached_tokens=10**9)
    encoder.encode(text)
    encoder.encode(text)  # a piece is cached on its second sighting
    if as_lists:
        for piece, ids in list(encoder._cache.items()):
            encoder._cache[piece] = list(ids)  # type: ignore[assignment]  # what the cache held before December 7
    return encoder


def per_encode_s(encoder: ChunkedEncoder, text: str, repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        encoder.encode(text)
    return (time.perf_counter() - started) / repeat


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m research.probes.piece_cache_hit", description=__doc__.splitlines()[0])
    p.add_argument("--kb", type=int, default=64)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--repeat", type=int, default=50)
    args = p.parse_args(argv)
    rng = random.Random(1)
    text = " ".join(rng.choice(WORDS) + str(rng.randrange(10**6)) for _ in range(args.kb * 1024 // 11))
    text = text[:args.kb * 1024]
    arrays, lists = cached(text, False), cached(text, True)
    assert arrays.encode(text) == lists.encode(text)
    times: dict[str, list[float]] = {"array": [], "list": []}
    for _ in range(args.rounds):
        times["array"].append(per_encode_s(arrays, text, args.repeat))
        times["list"].append(per_encode_s(lists, text, args.repeat))
    tokens = len(arrays.encode(text))
    a, b = statistics.median(times["array"]), statistics.median(times["list"])
    print(f"{args.kb} KiB, {tokens:,} tokens, every piece cached but the tail: arrays {a * 1e6:.0f} us an encode, "
          f"lists {b * 1e6:.0f} us; arrays / lists {a / b:.2f}x, +{(a - b) / tokens * 1e9:.1f} ns a token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
