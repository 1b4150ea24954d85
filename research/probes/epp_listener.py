"""The hot-path cost of the endpoint picker's metric families (telemetry/epp.py) and of counting prefix
lookups per source (prefix/counted.py), in-process.

    python -m research.probes.epp_listener [--quick] [--json]

One request's lifecycle events (decided, responded, ended) through the native telemetry listeners alone,
then with the EPP listener added; and one prefix lookup with and without its per-source counter. The
figures are process CPU per request, the fastest of many interleaved rounds (on a shared machine the
fastest round is the one least disturbed by other work).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench import inprocess_cli
from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.policies.base import Candidate
from loadaware.prefix.counted import SourceLookups
from loadaware.telemetry.decisions import DecisionMetrics
from loadaware.telemetry.epp import EppMetrics, PodLoad
from loadaware.telemetry.metrics import Metrics

ENDPOINTS = tuple(f"10.0.0.{i}:8000" for i in range(1, 9))


class _Fixed:
    name = "kv-events"

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        return {endpoints[0]: 256}


def _lifecycle(with_epp: bool) -> RequestLifecycle:
    metrics = Metrics("loadaware")
    lifecycle = RequestLifecycle()
    listener = DecisionMetrics(metrics)
    lifecycle.subscribe(listener)
    lifecycle.subscribe_outcomes(listener)
    if with_epp:
        lifecycle.subscribe(EppMetrics(metrics.registry, "pool", lambda: [PodLoad(e, 1, 0, 0.5) for e in ENDPOINTS],
                                       metrics.decision_seconds, time.time))
    return lifecycle


def _requests_per_round(lifecycle: RequestLifecycle, n: int) -> float:
    candidates = tuple(Candidate(e, 0, 1.0) for e in ENDPOINTS)
    scores = tuple(0.0 for _ in ENDPOINTS)
    stages = {"parse": 1e-5, "tokenize": 1e-4, "lookup": 1e-4, "score": 1e-5}
    start = time.process_time()
    for i in range(n):
        d = Decision(str(i), ENDPOINTS[i % 8], "routed", (), 1000, candidates, scores, stages, 3e-4,
                     ranked=ENDPOINTS[:3], model="m")
        lifecycle.decided(d)
        lifecycle.responded(d, 200, None)
        lifecycle.ended(d)
    return (time.process_time() - start) / n * 1e6


def _lookups_per_round(counted: bool, n: int) -> float:
    source: Any = SourceLookups(Metrics("loadaware").registry).wrap(_Fixed()) if counted else _Fixed()
    tokens = list(range(1000))

    async def loop() -> None:
        for _ in range(n):
            await source.matches(tokens, ENDPOINTS)

    start = time.process_time()
    asyncio.run(loop())
    return (time.process_time() - start) / n * 1e6


def run(quick: bool = False) -> dict[str, Any]:
    n, rounds = (1_000, 3) if quick else (5_000, 25)
    native, with_epp = _lifecycle(False), _lifecycle(True)
    samples: dict[str, list[float]] = {k: [] for k in ("lifecycle_native_us", "lifecycle_with_epp_us",
                                                        "lookup_plain_us", "lookup_counted_us")}
    for _ in range(rounds):  # interleaved: a burst of other work on the machine hits both sides alike
        samples["lifecycle_native_us"].append(_requests_per_round(native, n))
        samples["lifecycle_with_epp_us"].append(_requests_per_round(with_epp, n))
        samples["lookup_plain_us"].append(_lookups_per_round(False, n))
        samples["lookup_counted_us"].append(_lookups_per_round(True, n))
    out: dict[str, Any] = {"requests_per_round": n, "rounds": rounds}
    out.update({k: min(v) for k, v in samples.items()})
    out["epp_delta_us"] = out["lifecycle_with_epp_us"] - out["lifecycle_native_us"]
    out["counted_delta_us"] = out["lookup_counted_us"] - out["lookup_plain_us"]
    return out


def table(r: dict[str, Any]) -> str:
    return "\n".join([
        "### The EPP metric families and per-source lookup counts: hot-path CPU per request",
        "",
        "| what | without | with | added |",
        "|---|---|---|---|",
        f"| lifecycle events (decided, responded, ended) | {r['lifecycle_native_us']:.2f} µs | "
        f"{r['lifecycle_with_epp_us']:.2f} µs | {r['epp_delta_us']:.2f} µs |",
        f"| one prefix lookup (a stand-in source) | {r['lookup_plain_us']:.2f} µs | "
        f"{r['lookup_counted_us']:.2f} µs | {r['counted_delta_us']:.2f} µs |",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    return inprocess_cli.main("python -m research.probes.epp_listener", __doc__, run, table, argv)


if __name__ == "__main__":
    sys.exit(main())
