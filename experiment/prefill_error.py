"""How far BUFFERED mode's prefill queue is from the truth, measured in the discrete-event simulator.

    python -m experiment.prefill_error [--seeds 5] [--points reference,queueing] [--arm loadaware] [--json]

The simulation runs the arm as `experiment.des` does; beside it the sidecar's own `SignalTracker` hears
what BUFFERED mode hears: each decision and each request's end, never a first token, plus a scrape of each
engine's TTFT histogram (sum and count of engine arrival -> first token, as vLLM and sim/ export it) at the
first decision after every `--scrape-interval-s`. At every measured decision, for every engine:

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
from dataclasses import dataclass
from typing import Any

from experiment.des import Prepared, Simulation, _Engine, _Req, arm_by_name
from experiment.grid import POINTS_BY_NAME, prepared
from loadaware.lifecycle import Decision
from loadaware.load.signals import SignalTracker
from loadaware.load.tracker import EngineStats
from loadaware.policies.base import Candidate


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
    """The simulation, with the sidecar's signal tracker fed as BUFFERED mode feeds it."""

    def __init__(self, prepared: Prepared, arm_name: str, point_name: str, seed: int, scrape_interval_s: float
                 ) -> None:
        point = POINTS_BY_NAME[point_name].point
        super().__init__(prepared, arm_by_name(arm_name), point.fleet, seed)
        self.tracker = SignalTracker(clock=lambda: self.now)
        self.scrape_interval_s = scrape_interval_s
        self._next_scrape = 0.0
        self._ttft_sum = {e.name: 0.0 for e in self.engines}
        self._ttft_count = {e.name: 0.0 for e in self.engines}
        self._decisions: dict[int, Decision] = {}
        self.errors = Errors()

    def _scrape(self, t: float) -> None:
        for name in self.endpoints:
            self.tracker.scraped(name, EngineStats(0.0, 0.0, None, t, self._ttft_sum[name], self._ttft_count[name]))
        self._next_scrape = t + self.scrape_interval_s

    def _measure(self) -> None:
        err = self.errors
        for e in self.engines:
            sig = self.tracker.get(e.name)
            estimate = sig.prefill_tokens if sig is not None else 0
            err.samples += 1
            err.truth += e.prefill_tokens
            err.estimate += abs(estimate - e.prefill_tokens)
            err.at_end += abs(e.uncached_tokens - e.prefill_tokens)

    def _track_decided(self, e: _Engine, r: _Req, matched: int, t: float) -> None:
        if t >= self._next_scrape:
            self._scrape(t)
        if self._measuring:
            self._measure()
        super()._track_decided(e, r, matched, t)
        n = r.sim.n_tokens
        decision = Decision(str(r.sim.index), e.name, "routed", (), n, (Candidate(e.name, matched, r.running_at),),
                            (0.0,), {}, 0.0)
        self.tracker.on_decided(decision)
        self._decisions[id(r)] = decision

    def _track_first_token(self, e: _Engine, r: _Req, t: float) -> None:
        super()._track_first_token(e, r, t)
        self._ttft_sum[e.name] += t - r.decided_t  # the engine's histogram: its arrival -> first token
        self._ttft_count[e.name] += 1

    def _track_ended(self, e: _Engine, r: _Req) -> None:
        super()._track_ended(e, r)
        decision = self._decisions.pop(id(r), None)
        if decision is not None:
            self.tracker.on_ended(decision)


def measure(point: str, seeds: Sequence[int], arm: str, scrape_interval_s: float) -> Errors:
    total = Errors()
    fleet = POINTS_BY_NAME[point].point
    for seed in seeds:
        sim = BufferedView(prepared(fleet, seed, None), arm, point, seed, scrape_interval_s)
        sim.run()
        total.add(sim.errors)
    return total


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiment.prefill_error", description=(__doc__ or "").splitlines()[0])
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
