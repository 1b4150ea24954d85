"""The short experiment `make demo` ends with: 2 seeds x 3 arms of the reference point in real time.

Full-size prompts and the reference's 2 engines at 16 req/s, but 160 measured requests per seed after one
warm-up pass over the 128 prefixes (the reference makes two; the cold pass is prefill-bound, ~25 s whatever
its rate), so the six runs take ~4 minutes. Arms: kvaware, loadaware beta = 0.5 on stock
LMCache credit, and the same on KV-events credit: stock LMCache credits one holder per chunk, KV events
credit every engine that holds it (docs/architecture.md, "Data sources"), in one table.
Two seeds cannot make a test significant (the smallest one-sided exact Wilcoxon p with n pairs is 2^-n);
`make experiment` is the real thing. The `tiny` point runs the same path in seconds (the demo's test).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from experiment.realtime.arms import parse_arms
from experiment.realtime.driver import DriverConfig, run_experiment, summary_table
from experiment.realtime.points import OperatingPoint, point_by_name

DEMO_ARMS = "kvaware,loadaware-b0.5,loadaware-b0.5-kvev"
DEMO_SEEDS = [1, 2]


def demo_point(name: str) -> OperatingPoint:
    """The reference point shortened to 160 requests per seed and one warm-up pass, or the CI-sized point."""
    if name == "tiny":
        return point_by_name("tiny")
    point = point_by_name(name, n_requests=160)
    return replace(point, workload=replace(point.workload, warmup_passes=1, warmup_rate=32.0))


def run_demo_experiment(out: Path, point_name: str = "reference") -> str:
    """Run it (the driver holds the loopback lock) and return the per-arm table of medians."""
    if (out / "per_seed.csv").exists():
        (out / "per_seed.csv").unlink()  # a fresh table, not one mixed with an older demo's rows
    cfg = DriverConfig(point=demo_point(point_name), arms=parse_arms(DEMO_ARMS), seeds=DEMO_SEEDS, out=out)
    run_experiment(cfg)
    return summary_table(out)
