"""The ext_proc fuzzer at scale: random conversations spoken straight to the servicer (testkit/extproc_fuzz.py).

    python -m bench.extproc_fuzz [--quick] [--json] [--cases N] [--grpc-share F] [--seed S] [--source random|hypothesis]

Runs N cases (default 100,000; --quick 2,000) in both processing modes, a share of them (default 2%) over
real gRPC on loopback, the rest in process. The cases come from the fuzzer's one case builder, its choices
made by a seeded random source (case i of seed S is `random_case(Random(S * 10**9 + i))`, so a failure
is replayed from its number) or, slower, by hypothesis (the tests' source). Each case is checked for the
fuzzer's invariants (no stream error, nothing logged at ERROR, at most one in-flight count per stream,
released exactly once, JSON errors in picker mode); a failing case is counted and the run goes on.
Prints cases run, cases per second, failures found (with the first few), and the largest in-flight count
one case leaked; then checks that a normal request still decides.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

from testkit.extproc_fuzz import Case, FuzzRig, a_normal_request_decides, cases, fuzz_sidecar, random_case

DEFAULT_CASES = 100_000
QUICK_CASES = 2_000
BATCH = 5_000  # cases per hypothesis run: its per-run bookkeeping grows with the cases it has seen
SHOWN_FAILURES = 5
PROGRESS_EVERY = 10_000


async def _start(grpc_share: float) -> FuzzRig:
    rig = FuzzRig(fuzz_sidecar())
    if grpc_share > 0:
        await rig.start_grpc()
    return rig


def run(quick: bool = False, n_cases: int | None = None, grpc_share: float = 0.02, base_seed: int = 0,
        source: str = "random") -> dict[str, Any]:
    n = n_cases or (QUICK_CASES if quick else DEFAULT_CASES)
    loop = asyncio.new_event_loop()
    rig = loop.run_until_complete(_start(grpc_share))
    every = max(1, round(1 / grpc_share)) if grpc_share > 0 else 0
    tally: dict[str, Any] = {"cases": 0, "buffered": 0, "full_duplex": 0, "over_grpc": 0, "cancelled": 0, "failures": 0,
             "max_leaked": 0.0}
    shown: list[str] = []

    def one(case: Case) -> None:
        number = tally["cases"]
        over_grpc = bool(every) and tally["cases"] % every == 0
        tally["cases"] += 1
        tally["full_duplex" if case.duplex else "buffered"] += 1
        tally["over_grpc"] += over_grpc
        tally["cancelled"] += case.cancel_at is not None
        before = rig.leaked()
        problems = loop.run_until_complete(rig.check_case(case, over_grpc=over_grpc))
        tally["max_leaked"] = max(tally["max_leaked"], rig.leaked() - before)
        if problems:
            tally["failures"] += 1
            if len(shown) < SHOWN_FAILURES:
                shown.append(f"case {number}: {problems} in {case!r}")
        if tally["cases"] % PROGRESS_EVERY == 0:
            print(f"fuzz: {tally['cases']:,} cases, {tally['failures']:,} failures, "
                  f"{tally['cases'] / (time.perf_counter() - started):,.0f} cases/s", file=sys.stderr, flush=True)

    # The sidecar's warnings (ejections, fallbacks) would print a line per few cases; ERROR still reaches the
    # rig's own counter, which is the invariant.
    sidecar_log = logging.getLogger("loadaware")
    level = sidecar_log.level
    sidecar_log.setLevel(logging.ERROR)
    started = time.perf_counter()
    try:
        if source == "random":
            for i in range(n):
                one(random_case(random.Random(base_seed * 10**9 + i)))
        batch = 0
        while tally["cases"] < n:  # hypothesis: in batches, each a fresh run
            size = min(BATCH, n - int(tally["cases"]))
            runner = seed(base_seed + batch)(settings(
                max_examples=size, deadline=None, database=None, phases=[Phase.generate],
                suppress_health_check=list(HealthCheck))(given(case=cases())(one)))
            runner()
            batch += 1
        elapsed = time.perf_counter() - started
        after = loop.run_until_complete(a_normal_request_decides(rig.app))
    finally:
        sidecar_log.setLevel(level)
        loop.run_until_complete(rig.stop_grpc())
        rig.close_logging()
        if rig.app.tokenizer is not None:
            rig.app.tokenizer.close()
        loop.close()
    return {**tally, "source": source, "seed": base_seed, "seconds": elapsed,
            "cases_per_s": tally["cases"] / elapsed, "leaked_total": rig.leaked(),
            "stream_errors": rig.stream_errors(), "first_failures": shown,
            "still_deciding": after is not None and after.endpoint is not None}


def table(result: dict[str, Any]) -> str:
    rows = [f"### Fuzz: random ext_proc conversations straight to the servicer ({result['source']} source, "
            f"seed {result['seed']}, {result['seconds']:,.0f} s)\n",
            "| cases | BUFFERED / full duplex | over gRPC | client resets | cases/s | failures | max in-flight "
            "leaked by one case | leaked in all | stream errors | decides afterwards |",
            "|---|---|---|---|---|---|---|---|---|---|",
            f"| {result['cases']:,} | {result['buffered']:,} / {result['full_duplex']:,} | {result['over_grpc']:,} | "
            f"{result['cancelled']:,} | {result['cases_per_s']:,.0f} | {result['failures']:,} | "
            f"{result['max_leaked']:g} | {result['leaked_total']:g} | {result['stream_errors']:g} | "
            f"{'yes' if result['still_deciding'] else 'NO'} |"]
    rows += [f"- failure: {f}" for f in result["first_failures"]]
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.extproc_fuzz", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"{QUICK_CASES:,} cases instead of {DEFAULT_CASES:,}")
    p.add_argument("--cases", type=int, default=None, help="how many cases")
    p.add_argument("--grpc-share", type=float, default=0.02, help="share of the cases sent over real gRPC")
    p.add_argument("--seed", type=int, default=0, help="the random source's seed")
    p.add_argument("--source", choices=("random", "hypothesis"), default="random",
                   help="who makes the case builder's choices (hypothesis: the tests' source, ~20x slower)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    result = run(args.quick, args.cases, args.grpc_share, args.seed, args.source)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
