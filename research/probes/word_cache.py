"""What `tokenizers`' own word cache saves per encode, and the memory it keeps, by its capacity.

    python -m research.probes.word_cache [--tokenizer PATH] [--capacities default,0,1024,4096] [--texts 300]
        [--kb 8] [--random-words CHARS]

Why: the library's BPE model caches each word it has merged (up to 10,000 words by default, the first seen
kept for the process's life, nothing evicted) and the sidecar's live malloc rose with it for hours in the soak:
a bound still filling. The sidecar already keeps its own piece cache (tokenize/pieces.py), so the library's
cache only serves text that piece cache missed. This probe encodes the same distinct texts (windows of
`--kb` KB at different offsets of the repository's docs and sources, so no two are the same) through a fresh
Tokenizer per capacity, and prints per capacity: the median and p90 time of an encode, and the live malloc
(mallinfo2, after a full collection and a heap trim) kept once every text was encoded twice over.
`--random-words CHARS`: the texts are random lowercase words of CHARS letters instead (hashes, identifiers,
base64 without its symbols): each a word never seen before, the word cache's worst case per entry.
"""

from __future__ import annotations

import argparse
import random
import statistics
import string
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from loadaware.collector import settled_malloc_reader
from loadaware.tokenize.tokenizer import bound_word_cache
from sim.fleet import DEFAULT_TOKENIZER

ROOT = Path(__file__).resolve().parents[2]


def corpus() -> str:
    """The repository's prose and code, one text: what a coding agent's prompts are made of."""
    files = sorted(ROOT.glob("docs/*.md")) + sorted(ROOT.glob("loadaware/**/*.py"))
    return "\n".join(f.read_text(errors="replace") for f in files)


def windows(text: str, count: int, size: int) -> list[str]:
    step = max(1, (len(text) - size) // max(1, count))
    return [text[i * step:i * step + size] for i in range(count)]


def random_words(count: int, size: int, chars: int) -> list[str]:
    rng = random.Random(7)
    words = max(1, size // (chars + 1))
    return [" ".join("".join(rng.choices(string.ascii_lowercase, k=chars)) for _ in range(words))
            for _ in range(count)]


def measure(path: str, capacity: int | None, texts: list[str]) -> tuple[float, float, float]:
    """(median ms, p90 ms, MiB kept) for `texts` encoded twice through a Tokenizer whose word cache holds
    `capacity` words (None: the library's default)."""
    read = settled_malloc_reader()
    if read is None:
        raise SystemExit("needs glibc (mallinfo2, malloc_trim)")

    def live() -> float:
        return read() / 2**20

    tok = Tokenizer.from_file(path)
    if capacity is not None and not bound_word_cache(tok, capacity):
        raise SystemExit("this tokenizers cannot resize its word cache")
    before = live()
    times = []
    for _ in range(2):
        for text in texts:
            started = time.perf_counter()
            tok.encode(text, add_special_tokens=False)
            times.append((time.perf_counter() - started) * 1e3)
    kept = live() - before
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9)], kept


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m research.probes.word_cache", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER / "tokenizer.json"))
    ap.add_argument("--capacities", default="default,0,1024,4096")
    ap.add_argument("--texts", type=int, default=300)
    ap.add_argument("--kb", type=float, default=8.0)
    ap.add_argument("--random-words", type=int, default=0, metavar="CHARS")
    args = ap.parse_args(argv)
    size = int(args.kb * 1024)
    texts = random_words(args.texts, size, args.random_words) if args.random_words else \
        windows(corpus(), args.texts, size)
    kind = f"random words of {args.random_words} letters" if args.random_words else "docs and sources"
    print(f"{len(texts)} distinct texts of {args.kb:g} KB ({kind}), each encoded twice; {args.tokenizer}\n")
    print("| word cache (words) | encode median (ms) | p90 (ms) | live malloc kept (MiB) |")
    print("|---|---:|---:|---:|")
    for name in args.capacities.split(","):
        capacity = None if name == "default" else int(name)
        median, p90, kept = measure(args.tokenizer, capacity, texts)
        print(f"| {name} | {median:.2f} | {p90:.2f} | {kept:+.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
