"""How far BUFFERED mode's prefill queue is from the truth, measured in the discrete-event simulator.

    python -m research.prefill_error [--seeds 5] [--points reference,queueing] [--arm loadaware] [--json]

The simulation routes through the sidecar's own pipeline behind a BUFFERED Envoy (`response_seen` False): its
`SignalTracker` hears each decision and each request's end, never a first token, plus a scrape of each engine
(its TTFT histogram: sum and count of engine arrival -> first token, as vLLM and sim/ export it) every
`--scrape-interval-s`. At every measured decision, for every engine:

    truth     = uncached tokens routed there whose first token is not out (the picker-mode signal)
    estimate  = the tracker's prefill_tokens (retired one learned mean TTFT after the decision, or at the end)
    at_end    = uncached tokens in flight until the end (the BUFFERED signal before the estimate)

and the mean absolute error of each against the truth, also as a share of the mean truth, per point.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from experiment.des import Prepared, SimRequest, Simulation, _Engine, _Req
from experiment.grid import POINTS_BY_NAME, prepared
from research.arms import arm_by_name


@dataclass
class Errors:
    samples: int = 0
    truth: float = 0.0
    estimate: float = 0.0  # sums of absolute errors
    at_end: float = 0.0

    def add(self, other: Errors) -> None:
        self.samples += other.samples
        self.truth += other.truth
        self.estimate += other.estimate
        self.at_end += other.at_end

    def summary(self) -> dict[str, float]:
        n = max(1, self.samples)
        truth = self.truth / n
        return {"samples": self.samples, "mean_truth_tokens": truth,
                "mae_estimate_tokens": self.estimate / n, "mae_at_end_tokens": self.at_end / n,
                "mae_estimate_share": self.estimate / n / truth if truth else 0.0,
                "mae_at_end_share": self.at_end / n / truth if truth else 0.0}


class BufferedView(Simulation):
    """The simulation behind a BUFFERED Envoy, with the true prefill queue kept beside the sidecar's estimate."""

    def __init__(self, prepared: Prepared, arm_name: str, point_name: str, seed: int, scrape_interval_s: float
                 ) -> None:
        point = POINTS_BY_NAME[point_name].point
        fleet = replace(point.fleet, response_seen=False, router_scrape_interval_s=scrape_interval_s)
        super().__init__(prepared, arm_by_name(arm_name), fleet, seed)
        self._truth = {e.name: 0 for e in self.engines}
        self._in_flight = {e.name: 0 for e in self.engines}
        self._uncached: dict[int, int] = {}
        self.errors = Errors()

    def _decide(self, s: SimRequest) -> tuple[_Engine, int]:
        if self._measuring:
            err = self.errors
            for e in self.engines:
                sig = self.router.signals.get(e.name)
                estimate = sig.prefill_tokens if sig is not None else 0
                truth = self._truth[e.name]
                err.samples += 1
                err.truth += truth
                err.estimate += abs(estimate - truth)
                err.at_end += abs(self._in_flight[e.name] - truth)
        return super()._decide(s)

    def _track_decided(self, e: _Engine, r: _Req, matched: int, t: float) -> None:
        super()._track_decided(e, r, matched, t)
        uncached = max(0, r.sim.n_tokens - matched)
        self._uncached[id(r)] = uncached
        self._truth[e.name] += uncached
        self._in_flight[e.name] += uncached

    def _prefill_done(self, r: _Req, t: float) -> None:
        assert r.engine is not None
        self._truth[r.engine.name] -= self._uncached.get(id(r), 0)
        super()._prefill_done(r, t)

    def _track_ended(self, e: _Engine, r: _Req) -> None:
        super()._track_ended(e, r)
        self._in_flight[e.name] -= self._uncached.pop(id(r), 0)


def measure(point: str, seeds: Sequence[int], arm: str, scrape_interval_s: float) -> Errors:
    total = Errors()
    fleet = POINTS_BY_NAME[point].point
    for seed in seeds:
        sim = BufferedView(prepared(fleet, seed, None), arm, point, seed, scrape_interval_s)
        sim.run()
        total.add(sim.errors)
    return total


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m research.prefill_error", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--points", default="reference,queueing")
    p.add_argument("--arm", default="loadaware")
    p.add_argument("--scrape-interval-s", type=float, default=1.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out: dict[str, Any] = {}
    for point in args.points.split(","):
        out[point] = measure(point, range(args.seeds), args.arm, args.scrape_interval_s).summary()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"arm {args.arm}, {args.seeds} seeds, scrape every {args.scrape_interval_s:g} s; mean absolute error of "
          "the prefill queue (uncached tokens) against the truth, per engine at every decision")
    print("| point | mean truth | retired at the end | estimate (mean TTFT from the engine's histogram) |")
    print("|---|---|---|---|")
    for point, s in out.items():
        print(f"| {point} | {s['mean_truth_tokens']:,.0f} | {s['mae_at_end_tokens']:,.0f} "
              f"({s['mae_at_end_share']:.0%}) | {s['mae_estimate_tokens']:,.0f} ({s['mae_estimate_share']:.0%}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
