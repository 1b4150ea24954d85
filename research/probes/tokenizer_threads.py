"""Live malloc per `tokenizers` encode when encodes alternate between the main thread and a worker thread.

    python -m research.probes.tokenizer_threads [--encodes 300000] [--every 64] [--worker own|shared|python]
        [--workers 2] [--word-cache WORDS]

Why: the sidecar's request path in process (`python -m bench.memory_per_request`) kept a few bytes of live malloc a
request with a tokenizer and none without, all of it native (Python's allocated blocks flat; docs/memory.md). The
sidecar encodes most prompts on the event loop's thread and some in its tokenizer pool (the exactness check's
whole-text encode, 1 in 64). This probe does only that: the soak's prompt tails (their last 300 characters) encoded
with the repository's tiny tokenizer, one in `--every` on a pool thread (0: none), and reads live malloc (mallinfo2,
after a full collection and a heap trim) every 100,000 encodes. `--worker own`: the pool thread encodes with a
Tokenizer of its own; `python`: it builds a list of ints instead (the control: plain Python work across threads).
`--word-cache WORDS`: the library's word cache resized to that many words first (as the sidecar does, to 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tokenizers import Tokenizer

from bench.memory_per_request import Mix, Traffic
from loadaware.collector import settled_malloc_reader
from loadaware.tokenize.tokenizer import bound_word_cache
from sim.fleet import DEFAULT_TOKENIZER

EVERY_READ = 100_000


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m research.probes.tokenizer_threads", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encodes", type=int, default=300_000)
    ap.add_argument("--every", type=int, default=64)
    ap.add_argument("--worker", choices=("shared", "own", "python"), default="shared")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--word-cache", type=int, default=None, metavar="WORDS",
                    help="resize the library's word cache first (default: the library's own capacity)")
    args = ap.parse_args(argv)
    path = str(DEFAULT_TOKENIZER / "tokenizer.json")
    main_tok = Tokenizer.from_file(path)
    if args.word_cache is not None and not bound_word_cache(main_tok, args.word_cache):
        print("this tokenizers cannot resize its word cache", file=sys.stderr)
        return 2
    local = threading.local()

    def in_worker(text: str) -> Any:
        if args.worker == "python":
            return [1000 + j for j in range(80 + len(text) % 50)]
        if args.worker == "own":
            if not hasattr(local, "tok"):
                local.tok = Tokenizer.from_file(path)
                if args.word_cache is not None:
                    bound_word_cache(local.tok, args.word_cache)
            return local.tok.encode(text, add_special_tokens=False).ids
        return main_tok.encode(text, add_special_tokens=False).ids

    live = settled_malloc_reader()
    if live is None:
        print("needs glibc (mallinfo2, malloc_trim)", file=sys.stderr)
        return 2

    pool = ThreadPoolExecutor(args.workers)
    traffic = Traffic(Mix(), 7)
    on_main: Callable[[str], Any] = (lambda t: [1000 + j for j in range(80 + len(t) % 50)]) \
        if args.worker == "python" else (lambda t: main_tok.encode(t, add_special_tokens=False).ids)
    last: int | None = None
    for i in range(args.encodes):
        text = json.loads(traffic.body(i, False))["prompt"][-300:]
        if args.every and i % args.every == 0:
            pool.submit(in_worker, text).result()
        else:
            on_main(text)
        if i % EVERY_READ == EVERY_READ - 1:
            now = live()
            if last is not None:
                print(f"{args.worker} every={args.every} workers={args.workers} word cache "
                      f"{'default' if args.word_cache is None else args.word_cache} encodes {i + 1:,}: "
                      f"{(now - last) / EVERY_READ:+.2f} B of live malloc per encode", flush=True)
            last = now
    pool.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
