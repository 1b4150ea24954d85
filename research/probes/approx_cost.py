"""What the approximate prefix index (loadaware/prefix/approx.py) costs a long prompt's decision, in process.

    python -m research.probes.approx_cost [--tokens 97000] [--turn-tokens 1000] [--rounds 9] [--json]

The source as the sidecar wires it (prefix/wiring.py: `--approx-capacity-tokens` 100k per engine in blocks of 16,
`--approx-max-blocks`, three engines), fed a decision's prompt as the pipeline hands it over (a `PromptTokens`):
the lookup (`matches`), then the record (`on_decided`, the lifecycle's listener), each timed with
`time.perf_counter`; the figure per case is the median over its requests, µs per request. Cases:

    distinct    a prompt of `--tokens` never seen, into an index with room for it (nothing evicted)
    next_turn   a session's next turn: its history, recorded on the same engine by the turn before, plus
                `--turn-tokens` new tokens (the history starts `turns x turn-tokens` short of `--tokens`)
    evicting    distinct prompts of `--tokens` round robin over the engines, each engine's guess full: every
                record evicts about as many blocks as it adds (the steady state of many sessions at once,
                e.g. bench.long_prompts' conversation case, 150 sessions on three engines)

Also printed: how many times a request's block-key chain was computed (`block_keys` calls per request).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from loadaware.lifecycle import Decision
from loadaware.prefix import approx, blocks
from loadaware.prefix.approx import ApproxIndex, ApproxPrefixSource
from loadaware.prefix.source import PromptTokens
from loadaware.prefix.wiring import APPROX_TOKEN_BLOCK, PrefixOptions
from loadaware.telemetry.metrics import Metrics

ENGINES = ("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000")
VOCAB = 32_000


class Chains:
    """Counts block-key chains computed (blocks.block_keys, however it is reached) while entered."""

    def __init__(self) -> None:
        self.calls = 0
        self._real = blocks.block_keys

    def __enter__(self) -> Chains:
        def counted(*args: Any, **kwargs: Any) -> list[int]:
            self.calls += 1
            return self._real(*args, **kwargs)
        blocks.block_keys = counted
        approx.block_keys = counted
        return self

    def __exit__(self, *exc: object) -> None:
        blocks.block_keys = self._real
        approx.block_keys = self._real


def source() -> ApproxPrefixSource:
    o = PrefixOptions(names=("approx",), have_tokenizer=True)
    index = ApproxIndex(max(1, o.approx_capacity_tokens // APPROX_TOKEN_BLOCK), APPROX_TOKEN_BLOCK, o.approx_ttl_s,
                        o.approx_max_blocks)
    return ApproxPrefixSource(index, Metrics("loadaware"), clock=time.monotonic)


CHAINS = Chains()
Sample = tuple[float, float, int]


def one(src: ApproxPrefixSource, tokens: Sequence[int], engine: str) -> Sample:
    """One decision's lookup and record: (lookup s, record s, chains computed)."""
    prompt = PromptTokens(tokens)
    chains = CHAINS.calls
    t0 = time.perf_counter()
    src.lookup(prompt, ENGINES)
    t1 = time.perf_counter()
    src.on_decided(Decision("r", engine, "routed", (), len(prompt), (), (), {}, 0.0, tokens=prompt))
    return t1 - t0, time.perf_counter() - t1, CHAINS.calls - chains


def prompts(rng: random.Random, n: int, count: int) -> list[list[int]]:
    return [[rng.randrange(VOCAB) for _ in range(n)] for _ in range(count)]


def case_distinct(rng: random.Random, tokens: int, rounds: int) -> list[Sample]:
    out = []
    for p in prompts(rng, tokens, rounds):
        out.append(one(source(), p, ENGINES[0]))
    return out


def case_next_turn(rng: random.Random, tokens: int, turn: int, rounds: int) -> list[Sample]:
    out = []
    turns = 5
    for _ in range(max(1, rounds // turns)):
        src = source()
        history = prompts(rng, tokens - turns * turn, 1)[0]
        one(src, history, ENGINES[0])  # the session so far, recorded: not measured
        for _ in range(turns):
            history = history + prompts(rng, turn, 1)[0]
            out.append(one(src, history, ENGINES[0]))
    return out


def case_evicting(rng: random.Random, tokens: int, rounds: int) -> list[Sample]:
    src = source()
    warm = 2 * len(ENGINES)
    batch = prompts(rng, tokens, warm + rounds)
    out = []
    for i, p in enumerate(batch):
        figures = one(src, p, ENGINES[i % len(ENGINES)])
        if i >= warm:
            out.append(figures)
    return out


def summarize(name: str, run: Callable[[], list[Sample]]) -> dict[str, Any]:
    with CHAINS:
        samples = run()
    lookup = statistics.median(s[0] for s in samples) * 1e6
    record = statistics.median(s[1] for s in samples) * 1e6
    total = statistics.median(s[0] + s[1] for s in samples) * 1e6
    return {"case": name, "requests": len(samples), "lookup_us": round(lookup), "record_us": round(record),
            "total_us": round(total), "chains_per_request": round(sum(s[2] for s in samples) / max(1, len(samples)), 2)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m research.probes.approx_cost", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=97_000, help="prompt length in tokens (a 220 KB chat prompt)")
    p.add_argument("--turn-tokens", type=int, default=1_000, help="a session's next turn, in tokens")
    p.add_argument("--rounds", type=int, default=9, help="measured requests per case")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rng = random.Random(7)
    results = [
        summarize("distinct", lambda: case_distinct(rng, args.tokens, args.rounds)),
        summarize("next_turn", lambda: case_next_turn(rng, args.tokens, args.turn_tokens, 2 * args.rounds)),
        summarize("evicting", lambda: case_evicting(rng, args.tokens, args.rounds)),
    ]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"approximate index, {args.tokens:,}-token prompts, µs per request (median), lookup + record:")
    for r in results:
        print(f"  {r['case']:<10} {r['total_us']:>7,} = {r['lookup_us']:>6,} + {r['record_us']:>6,}   "
              f"chains computed per request: {r['chains_per_request']}   ({r['requests']} requests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
