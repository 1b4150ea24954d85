"""What a piece-cache hit costs, and what a prompt's ids keep in Python's arenas: shared ints against arrays.

    python -m research.probes.piece_cache_hit [--kb 64] [--rounds 9] [--repeat 50] [--kept 100]

Two encoders hold the same cached pieces of one text of `--kb` KiB (the sidecar's tokenized head is 64 KiB:
--tokenize-max-chars). One is the shipped cache: each piece's ids a list of the vocabulary's shared int objects
(tokenize/shared_ids.py), copied into a prompt by reference. The other holds each piece as an `array('i')`, as
the cache did for part of December 7: 4 bytes a token, but every id copied out into the prompt is a new int.
The two encode the text in turn, round after round (a busy machine slows both alike). Printed: each one's median
over the rounds of the best of `--repeat` encodes' mean and the ratio; then, for `--kept` encoded prompts held
at once (as held requests hold them), the Python blocks they add a token (sys.getallocatedblocks). Ids are spread
over a 151k vocabulary (~5 characters a token), as a large model's are: most are above 256, not Python's cached
small ints.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from array import array
from collections.abc import Sequence

from loadaware.tokenize.pieces import ChunkedEncoder
from loadaware.tokenize.shared_ids import SharedIds

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma")
VOCAB = 151_000
SHARED = SharedIds(VOCAB)


def fake_encode(text: str) -> list[int]:
    """Ids that depend on the text only (a piece encodes the same every time), ~5 characters a token, shared as
    the sidecar's tokenizer shares them."""
    rng = random.Random(text)
    return SHARED([rng.randrange(300, VOCAB) for _ in range(max(1, len(text) // 5))])


def cached(text: str, as_arrays: bool) -> ChunkedEncoder:
    encoder = ChunkedEncoder(fake_encode, max_cached_tokens=10**9)
    encoder.encode(text)
    encoder.encode(text)  # a piece is cached on its second sighting
    if as_arrays:
        for piece, ids in list(encoder._cache.items()):
            encoder._cache[piece] = array("i", ids)  # type: ignore[assignment]  # the cache of December 7
    return encoder


def per_encode_s(encoder: ChunkedEncoder, text: str, repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        encoder.encode(text)
    return (time.perf_counter() - started) / repeat


def blocks_per_token(encoder: ChunkedEncoder, text: str, kept: int) -> float:
    """Python blocks that `kept` encoded prompts, held at once, add per token they hold."""
    gc.collect()
    before = sys.getallocatedblocks()
    held = [encoder.encode(text) for _ in range(kept)]
    gc.collect()
    added = sys.getallocatedblocks() - before
    return added / sum(len(ids) for ids in held)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m research.probes.piece_cache_hit", description=__doc__.splitlines()[0])
    p.add_argument("--kb", type=int, default=64)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--kept", type=int, default=100)
    args = p.parse_args(argv)
    rng = random.Random(1)
    text = " ".join(rng.choice(WORDS) + str(rng.randrange(10**6)) for _ in range(args.kb * 1024 // 11))
    text = text[:args.kb * 1024]
    shared, arrays = cached(text, False), cached(text, True)
    assert shared.encode(text) == arrays.encode(text)
    times: dict[str, list[float]] = {"shared": [], "array": []}
    for _ in range(args.rounds):
        times["shared"].append(per_encode_s(shared, text, args.repeat))
        times["array"].append(per_encode_s(arrays, text, args.repeat))
    tokens = len(shared.encode(text))
    a, b = statistics.median(times["shared"]), statistics.median(times["array"])
    print(f"{args.kb} KiB, {tokens:,} tokens, every piece cached but the tail: shared ints {a * 1e6:.0f} us an "
          f"encode, arrays {b * 1e6:.0f} us; arrays / shared {b / a:.2f}x, {(b - a) / tokens * 1e9:+.1f} ns a token")
    held_shared, held_arrays = blocks_per_token(shared, text, args.kept), blocks_per_token(arrays, text, args.kept)
    print(f"{args.kept} prompts held: Python blocks a token, shared ints {held_shared:.3f}, arrays {held_arrays:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
