"""Why a placement arm's TTFT tail is what it is (issue 17): per-seed admission queues and predictive's costs.

    python -m research.placement_probe seeds --point queueing --seeds 201-230 --arms predictive,lmetric
    python -m research.placement_probe costs --point queueing --seed 210 --from 2.9 --to 3.1

`seeds`: per seed, each arm's TTFT p95, the fleet's mean admission queue (scraped waiting, mean over engines
and samples), the highest running count any engine reached and the first time (s into the measured window)
an engine queued. `costs`: predictive's decisions in a time window, each candidate's cost split into its
terms (own = base + lane + per_running x load, stall, crowd), to see why a holder was kept or left.

Seeds 1-10 are the grid's design seeds and 101-120 its held-out seeds; use others (e.g. 201-230) to diagnose.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from experiment.des import SimRequest, Simulation, _Engine
from experiment.grid import POINTS_BY_NAME, GridPoint, prepared
from experiment.metrics import DEFAULT_SLO_S, seed_metrics
from loadaware.policies.base import Candidate
from research.arms import arm_by_name
from research.predictive import Predictive
from research.variants import VARIANTS


class ProbeSimulation(Simulation):
    """The simulator, recording every measured decision: (t, prefix, prompt, candidates, chosen index) and
    per engine (running, waiting) at that moment."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.decisions: list[tuple[float, int, int, tuple[Candidate, ...], int, list[tuple[int, int]]]] = []

    def _decide(self, s: SimRequest) -> tuple[_Engine, int]:
        engine, matched = super()._decide(s)
        if self._measuring and self._decision is not None:
            cands: tuple[Candidate, ...] = self._decision.candidates  # what the sidecar's pipeline scored
            ttft_prices = self.arm.reads.ttft_models
            if ttft_prices is not None:  # as the arm saw them: with the TTFT model's prices (research.candidates)
                cands = tuple(ttft_prices(cands, self.router.signals))
            self.decisions.append((self.now, s.prefix, s.n_tokens, cands, engine.index,
                                   [(e.running, len(e.waiting)) for e in self.engines]))
        return engine, matched


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def probe_seeds(gp: GridPoint, arms: Sequence[str], seeds: Sequence[int], cache: Path | None) -> None:
    print("seed " + " ".join(f"{a[:14]:>30}" for a in arms))
    print("     " + " ".join(f"{'p95 / waiting / max run / 1st queue':>30}" for _ in arms))
    for seed in seeds:
        work = prepared(gp.point, seed, cache)
        cells = []
        for name in arms:
            sim = ProbeSimulation(work, arm_by_name(name), gp.point.fleet, seed)
            run = sim.run()
            m = seed_metrics(run, DEFAULT_SLO_S)
            t0 = run.requests[0].send_t
            queued = [t - t0 for t, *_, st in sim.decisions if any(w > 0 for _, w in st)]
            top = max((r for *_, st in sim.decisions for r, _ in st), default=0)
            first = f"{queued[0]:.1f}s" if queued else "-"
            cells.append(f"{m.ttft_p95:7.3f} / {m.waiting_mean:5.2f} / {top:3d} / {first:>5}")
        print(f"{seed:4d} " + " ".join(f"{c:>30}" for c in cells))


def probe_costs(gp: GridPoint, seed: int, lo: float, hi: float, cache: Path | None) -> None:
    sim = ProbeSimulation(prepared(gp.point, seed, cache), arm_by_name("predictive"), gp.point.fleet, seed)
    run = sim.run()
    assert isinstance(sim.policy, Predictive)
    t0 = run.requests[0].send_t
    for t, prefix, n, cands, chosen, _ in sim.decisions:
        if lo <= t - t0 <= hi:
            queueing = any(c.waiting > 0 for c in cands)
            print(f"t={t - t0:.2f}s prefix {prefix} -> {cands[chosen].endpoint}"
                  + ("  (an engine is queueing: LMetric's product decides)" if queueing else ""))
            for c in cands:
                own, stall, crowd = sim.policy.terms(n, c)
                print(f"    {c.endpoint} matched {min(n, c.matched_tokens):5d} load {c.load:3.0f} decode "
                      f"{c.decode_batch:3.0f} waiting {c.waiting:2.0f}  own {own:.3f}  stall {stall:.3f}  "
                      f"crowd {crowd:.3f}  total {own + stall + crowd:.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m research.placement_probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seeds")
    s.add_argument("--point", default="queueing")
    s.add_argument("--seeds", type=_seeds, default="201-230", help="FIRST-LAST or one seed")
    s.add_argument("--arms", default="predictive,lmetric", help="registered arms, e.g. " + ", ".join(VARIANTS))
    c = sub.add_parser("costs")
    c.add_argument("--point", default="queueing")
    c.add_argument("--seed", type=int, default=210)
    c.add_argument("--from", dest="lo", type=float, default=0.0)
    c.add_argument("--to", dest="hi", type=float, default=1.0)
    for p in (s, c):
        p.add_argument("--cache", type=Path, default=Path("out/experiment/grid-workloads"))
    args = ap.parse_args(argv)
    if args.cmd == "seeds":
        probe_seeds(POINTS_BY_NAME[args.point], [a.strip() for a in args.arms.split(",")], args.seeds,
                    args.cache)
    else:
        probe_costs(POINTS_BY_NAME[args.point], args.seed, args.lo, args.hi, args.cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
