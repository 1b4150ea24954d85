"""Run the reference experiment in the discrete-event simulator and write its report.

    python -m experiment.des_run --seeds 20 --arms all --engines 2 --rate 16 [--credit single|multi|gpu]
        [--out out/experiment/des] [--jobs 2] [--second engines=4,rate=40] [--no-sweep] [--no-plots]
        [any ServiceModel flag, e.g. --decode-per-seq-ms 1.2, on top of experiment.calibration]

Writes to --out: per_seed.csv (every arm x seed of every operating point), report.md (the calibration check,
the reference table, the paired tests of beta = 0.5 and 1.0 against kvaware, the second operating point,
the beta sweep over utilisation) and PNG plots, and prints report.md.

Operating points:
- reference: the reference workload on the given fleet (default 2 engines, 16 req/s, Poisson);
- second: a point where placement can cut latency: by default experiment.calibration's QUEUEING_* point
  (4 engines at 40 req/s: the engine holding the hottest prefixes queues under kvaware), same statistics;
- sweep: beta in {0, 0.25, 0.5, 1, 2, 4} (+ kvaware) over offered rates on 2 and 4 engines, fewer seeds;
  reports where the best beta lies by TTFT p95 and by SLO misses.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from experiment import report
from experiment.arms import SIDECAR_ARMS, Arm, arm_by_name
from experiment.calibration import CALIBRATED, QUEUEING_ENGINES, QUEUEING_WORKLOAD
from experiment.des import FleetConfig, prepare, simulate
from experiment.metrics import DEFAULT_SLO_S, SeedMetrics, seed_metrics
from experiment.records import RunRecords
from experiment.workload import WorkloadSpec, build
from sim.service_model import add_cli_flags, from_cli_args

SWEEP_BETAS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class Point:
    name: str
    spec: WorkloadSpec
    fleet: FleetConfig


@dataclass
class ArmSeed:
    metrics: SeedMetrics
    ttfts: np.ndarray
    series: tuple[list[float], dict[str, list[float]]] | None  # running per engine over time (one seed)


def running_series(run: RunRecords) -> tuple[list[float], dict[str, list[float]]]:
    lo, hi = run.window
    ts: list[float] = []
    per: dict[str, list[float]] = {}
    for s in run.samples:
        if lo <= s.t <= hi:
            if not ts or ts[-1] != s.t:
                ts.append(s.t)
            per.setdefault(s.engine, []).append(s.running)
    return ts, per


def run_seed(point: Point, arms: Sequence[Arm], seed: int, slo_s: float, keep_series: bool) -> list[ArmSeed]:
    """Every arm on one seed's workload (built and hashed once, shared by the arms)."""
    prepared = prepare(build(point.spec, seed), point.fleet.service.block_size)
    out = []
    for arm in arms:
        run = simulate(prepared, arm, point.fleet, seed)
        ttfts = np.array([r.ttft for r in run.requests if r.ok and r.ttft is not None], dtype=np.float32)
        out.append(ArmSeed(seed_metrics(run, slo_s), ttfts, running_series(run) if keep_series else None))
    return out


def _task(args: tuple[Point, tuple[Arm, ...], int, float, bool]) -> list[ArmSeed]:
    return run_seed(*args)


def run_point(point: Point, arms: Sequence[Arm], seeds: Sequence[int], slo_s: float, jobs: int,
              series_seed: int | None = None) -> dict[str, list[ArmSeed]]:
    tasks = [(point, tuple(arms), s, slo_s, s == series_seed) for s in seeds]
    if jobs > 1 and len(tasks) > 1:
        build(point.spec, seeds[0])  # warm the tokenizer/prefix caches once, inherited by forked workers
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            per_seed = list(pool.map(_task, tasks))
    else:
        per_seed = [_task(t) for t in tasks]
    out: dict[str, list[ArmSeed]] = {a.name: [] for a in arms}
    for results in per_seed:
        for arm, r in zip(arms, results):
            out[arm.name].append(r)
    return out


def metrics_of(res: dict[str, list[ArmSeed]]) -> dict[str, list[SeedMetrics]]:
    return {a: [r.metrics for r in rows] for a, rows in res.items()}


def write_per_seed(path: Path, points: dict[str, dict[str, list[SeedMetrics]]]) -> None:
    rows = [{"point": p, **m.row()} for p, res in points.items() for ms in res.values() for m in ms]
    if not rows:
        return
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def parse_point(text: str, base: Point) -> Point:
    """"engines=4,rate=40,arrival=mmpp" -> the base point with those fields replaced."""
    spec, fleet = base.spec, base.fleet
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, _, value = item.partition("=")
        if key == "engines":
            fleet = replace(fleet, engines=int(value))
        elif key == "credit":
            fleet = replace(fleet, credit=value)  # type: ignore[arg-type]
        elif key in ("rate", "burst_cv", "zipf_s", "warmup_rate"):
            float_field: dict[str, Any] = {key: float(value)}  # one of the float fields just listed
            spec = replace(spec, **float_field)
        elif key in ("requests", "n_requests"):
            spec = replace(spec, n_requests=int(value))
        elif key == "arrival":
            spec = replace(spec, arrival=value)  # type: ignore[arg-type]
        else:
            raise ValueError(f"unknown operating-point key {key!r}")
    return Point(text, spec, fleet)


def _la(beta: float) -> str:
    return arm_by_name(f"loadaware-b{beta}").name  # canonical cell name (loadaware-b1.0, loadaware-b0.25)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiment.des_run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=20, help="seeds 1..N (paired across arms)")
    p.add_argument("--arms", default="all", help="'all' or a comma list, e.g. kvaware,loadaware-b0.5")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--rate", type=float, default=16.0)
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--arrival", choices=("poisson", "gamma", "mmpp"), default="poisson")
    p.add_argument("--credit", choices=("single", "multi", "gpu"), default="multi",
                   help="prefix credit: multi = every LMCache-store holder (the reference's patched lookup); "
                        "single = stock LMCache; gpu = every GPU prefix-cache holder (KV events)")
    p.add_argument("--slo-ms", type=float, default=DEFAULT_SLO_S * 1000)
    p.add_argument("--router-scrape-s", type=float, default=0.0,
                   help="refine the router's own in-flight counts with engine scrapes at this interval (0: off)")
    p.add_argument("--scrape-lag-s", type=float, default=0.0)
    p.add_argument("--out", default="out/experiment/des")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--second", default=f"engines={QUEUEING_ENGINES},rate={QUEUEING_WORKLOAD.rate:g}",
                   help="second operating point as key=value list, on top of the first ('none' to skip)")
    p.add_argument("--sweep", default="2:8,12,16,20;4:24,32,40,48",
                   help="beta sweep cells 'engines:rate,rate;engines:rate,...' ('none' to skip)")
    p.add_argument("--sweep-seeds", type=int, default=10)
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--no-plots", action="store_true")
    add_cli_flags(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    service = from_cli_args(args, CALIBRATED)
    arms = list(SIDECAR_ARMS) if args.arms == "all" else [arm_by_name(a.strip()) for a in args.arms.split(",")]
    spec = WorkloadSpec(rate=args.rate, n_requests=args.requests, arrival=args.arrival)
    fleet = FleetConfig(engines=args.engines, service=service, credit=args.credit,
                        router_scrape_interval_s=args.router_scrape_s, router_scrape_lag_s=args.scrape_lag_s)
    slo_s = args.slo_ms / 1000
    seeds = list(range(1, args.seeds + 1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    all_points: dict[str, dict[str, list[SeedMetrics]]] = {}
    md: list[str] = []

    ref_point = Point("reference", spec, fleet)
    t = time.perf_counter()
    ref = run_point(ref_point, arms, seeds, slo_s, args.jobs, series_seed=seeds[0])
    timings["reference point"] = time.perf_counter() - t
    ref_m = metrics_of(ref)
    all_points["reference"] = ref_m
    title = (f"{args.engines} engines, {args.rate:g} req/s {args.arrival}, {args.requests} requests x "
             f"{len(seeds)} seeds, credit={args.credit}")
    md += ["# Reference experiment, discrete-event mode", "",
           f"Operating point: {title}. Service model: `experiment.calibration.CALIBRATED`"
           + (" with overrides" if service != CALIBRATED else "") + ". Medians over seeds; SLO = "
           f"{args.slo_ms:g} ms.", "", "## Calibration against the reference", "",
           report.calibration_table(ref_m), "", "## Reproduced table", "", report.arm_table(ref_m, True), "",
           "## Paired tests against kvaware (one-sided exact Wilcoxon, α = 0.025; bootstrap 95% CI)", "",
           report.paired_table(ref_m, [a.name for a in arms if a.name in ("loadaware-b0.5", "loadaware-b1.0")]),
           ""]
    if not args.no_plots:
        report.plot_imbalance(ref_m, out / "imbalance.png", f"Imbalance per arm ({title})")
        report.plot_ttft_cdf({a: np.concatenate([r.ttfts for r in rows]) for a, rows in ref.items()},
                             out / "ttft_cdf.png", f"TTFT CDF ({title})", slo_s)
        series = {a: rows[0].series for a, rows in ref.items()
                  if rows and rows[0].series and a in ("kvaware", "loadaware-b0.5", "loadaware-b1.0", "roundrobin")}
        report.plot_running(series, out / "running.png", f"Running requests per engine, seed {seeds[0]}")
        md += ["![imbalance](imbalance.png) ![TTFT CDF](ttft_cdf.png) ![running](running.png)", ""]

    if args.second.lower() != "none":
        second = parse_point(args.second, ref_point)
        t = time.perf_counter()
        sec = run_point(second, arms, seeds, slo_s, args.jobs)
        timings["second point"] = time.perf_counter() - t
        sec_m = metrics_of(sec)
        all_points["second:" + second.name] = sec_m
        stitle = (f"{second.fleet.engines} engines, {second.spec.rate:g} req/s {second.spec.arrival}, "
                  f"credit={second.fleet.credit}")
        md += [f"## Second operating point: {stitle}", "", report.arm_table(sec_m), "",
               "Paired against kvaware:", "",
               report.paired_table(sec_m, [a.name for a in arms if a.name.startswith("loadaware-b")
                                           and a.name != "loadaware-b0"]), ""]
        if "roundrobin" in sec_m:
            md += ["Paired against roundrobin and leastload:", "",
                   report.paired_table(sec_m, ["loadaware-b0.5", "loadaware-b1.0"], base="roundrobin",
                                       metrics=("ttft_p95", "slo_miss")), "",
                   report.paired_table(sec_m, ["loadaware-b0.5", "loadaware-b1.0"], base="leastload",
                                       metrics=("ttft_p95", "slo_miss")) if "leastload" in sec_m else "", ""]
        if not args.no_plots:
            report.plot_ttft_cdf({a: np.concatenate([r.ttfts for r in rows]) for a, rows in sec.items()},
                                 out / "ttft_cdf_second.png", f"TTFT CDF ({stitle})", slo_s)
            report.plot_imbalance(sec_m, out / "imbalance_second.png", f"Imbalance ({stitle})")
            md += ["![TTFT CDF](ttft_cdf_second.png) ![imbalance](imbalance_second.png)", ""]

    if not args.no_sweep and args.sweep.lower() != "none":
        sweep_arms = [arm_by_name("kvaware")] + [arm_by_name(_la(b)) for b in SWEEP_BETAS]
        sweep_seeds = list(range(1, args.sweep_seeds + 1))
        t = time.perf_counter()
        best_lines = []
        for cell in args.sweep.split(";"):
            engines_s, _, rates_s = cell.partition(":")
            n_eng = int(engines_s)
            sweep: dict[float, dict[str, list[SeedMetrics]]] = {}
            for rate in (float(r) for r in rates_s.split(",")):
                pt = Point(f"sweep-{n_eng}x{rate:g}", replace(spec, rate=rate), replace(fleet, engines=n_eng))
                sweep[rate] = metrics_of(run_point(pt, sweep_arms, sweep_seeds, slo_s, args.jobs))
                all_points[f"sweep:{n_eng}x{rate:g}"] = sweep[rate]
            best = report.best_beta(sweep)
            best_slo = report.best_beta(sweep, "slo_miss")
            best_lines.append(f"- {n_eng} engines: by TTFT p95 " + ", ".join(
                f"{r:g} req/s → β {a.removeprefix('loadaware-b')}" for r, a in sorted(best.items()))
                + "; by SLO misses " + ", ".join(
                f"{r:g} → β {a.removeprefix('loadaware-b')}" for r, a in sorted(best_slo.items())))
            md += [f"## Beta sweep over utilisation: {n_eng} engines ({len(sweep_seeds)} seeds per cell)", "",
                   "Median TTFT p95 (s):", "", report.sweep_table(sweep, "ttft_p95"), "",
                   "Median SLO miss share:", "", report.sweep_table(sweep, "slo_miss"), "",
                   "Median imbalance:", "", report.sweep_table(sweep, "imbalance"), "",
                   "Median prefix hit rate:", "", report.sweep_table(sweep, "prefix_hit_rate", higher_is_better=True),
                   ""]
            if not args.no_plots:
                png = f"hit_vs_beta_{n_eng}.png"
                report.plot_hit_vs_beta(sweep, out / png, f"Beta sweep ({n_eng} engines)")
                md += [f"![hit rate and TTFT p95 vs beta]({png})", ""]
        timings["beta sweep"] = time.perf_counter() - t
        md += ["### Where the best beta lies", ""] + best_lines + [""]

    md += ["## Runtime", "", "| part | seconds |", "|---|---|"]
    md += [f"| {k} | {v:.1f} |" for k, v in timings.items()]
    md += ["", f"jobs = {args.jobs}; command: `python -m experiment.des_run {' '.join(argv or sys.argv[1:])}`", ""]
    write_per_seed(out / "per_seed.csv", all_points)
    (out / "report.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
