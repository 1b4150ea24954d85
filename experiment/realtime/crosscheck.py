"""The discrete-event twin of a real-time run: the same point, seeds and sidecar arms, simulated.

    python -m experiment.realtime.crosscheck twin out/experiment/realtime-reference
    python -m experiment.realtime.crosscheck des --point reference --seeds 1-20 --out out/experiment/des-kvev
    python -m experiment.realtime.crosscheck timeline out/experiment/realtime-queueing --arm predictive-kvev --seed 1

For every sidecar arm and seed of the real-time run it simulates the same workload on the same service
model with `experiment.des`, set up as the real stack runs: stock-LMCache arms get single-holder credit,
KV-events arms every engine's own GPU prefix-cache match (`experiment.des`'s "gpu" credit: what the engines
publish as KV events, evictions included; the LMCache stores' "multi" credit would keep crediting a holder
that evicted a prefix); the router refines its own in-flight counts with engine scrapes every second (the
sidecar's default `--scrape-interval-s`); the metrics are sampled at the driver's scrape interval.
Peer arms have no twin (their code is not ours to simulate). It writes `des_twin.csv` (the same
columns as per_seed.csv) next to the run, and prints how closely the two modes agree per arm.

`timeline` puts one (arm, seed) of a real-time run beside its twin: each engine's running and waiting over time
and which engines served the hottest prefixes, to see where the two modes part.

`des` runs the same simulation on its own, over many seeds, for the real-time arm set (including the
KV-events arms on "gpu" credit, which `experiment.des_run` leaves to its --credit flag),
and writes a des_run-style per_seed.csv (with a `point` column) that `experiment.results_doc` reads.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from experiment import arms as sim_arms
from experiment import des
from experiment.metrics import SeedMetrics, seed_metrics
from experiment.realtime import outputs
from experiment.realtime.arms import RealArm, arm_by_name, parse_arms
from experiment.realtime.points import point_by_name
from experiment.records import RunRecords
from experiment.workload import WorkloadSpec, build
from sim.service_model import ServiceModel

TWIN_CSV = "des_twin.csv"
SIDECAR_SCRAPE_S = 1.0  # the sidecar's --scrape-interval-s default, which the real-time arms run with
COMPARED = ("imbalance", "prefix_hit_rate", "ttft_mean", "ttft_p95", "itl_p50", "slo_miss")


def des_arm(arm: RealArm) -> sim_arms.Arm:
    return replace(sim_arms.arm_by_name(arm.name.removesuffix("-kvev")), name=arm.name)


def twin_run(prepared: des.Prepared, service: ServiceModel, engines: int, arm: RealArm, seed: int,
             sample_interval_s: float = 0.5) -> RunRecords:
    """One sidecar arm's seed, simulated as the real stack runs it."""
    credit: des.Credit = "gpu" if arm.credit == "gpu" else "single"
    fleet = des.FleetConfig(engines=engines, service=service, credit=credit,
                            sample_interval_s=sample_interval_s, router_scrape_interval_s=SIDECAR_SCRAPE_S)
    return des.Simulation(prepared, des_arm(arm), fleet, seed).run()


def simulate_twin(workload: WorkloadSpec, service: ServiceModel, engines: int, arms: Sequence[RealArm],
                  seeds: Sequence[int], sample_interval_s: float = 0.5) -> dict[str, dict[int, SeedMetrics]]:
    out: dict[str, dict[int, SeedMetrics]] = {}
    for seed in seeds:
        prepared = des.prepare(build(workload, seed), service.block_size)
        for arm in arms:
            if arm.kind == "sidecar":
                run = twin_run(prepared, service, engines, arm, seed, sample_interval_s)
                out.setdefault(arm.name, {})[seed] = seed_metrics(run)
    return out


def run_setup(out_dir: Path) -> tuple[WorkloadSpec, ServiceModel, int, float]:
    """(workload, service model, engines, scrape interval) of a finished real-time run, from its config.json."""
    config = outputs.load_config(out_dir)
    p = config["point"]
    return (WorkloadSpec(**p["workload"]), ServiceModel(**p["service"]), int(p["engines"]),
            float(config.get("scrape_interval_s", 0.5)))


def engine_timeline(run: RunRecords, bin_s: float = 2.0) -> dict[int, dict[str, tuple[float, float]]]:
    """{bin: {engine: (mean running, mean waiting)}} over the scrapes, bins of `bin_s` from the first send."""
    t0 = min(r.send_t for r in run.requests)
    sums: dict[int, dict[str, list[float]]] = {}
    for s in run.samples:
        if s.t >= t0:
            acc = sums.setdefault(int((s.t - t0) // bin_s), {}).setdefault(s.engine, [0.0, 0.0, 0.0])
            acc[0] += s.running
            acc[1] += s.waiting
            acc[2] += 1
    return {b: {e: (a[0] / a[2], a[1] / a[2]) for e, a in sorted(row.items())} for b, row in sorted(sums.items())}


def prefix_servers(run: RunRecords, prefixes: Sequence[int]) -> dict[int, dict[str, int]]:
    """{prefix: {engine: requests it served}} for the measured requests of each prefix."""
    out: dict[int, dict[str, int]] = {p: {} for p in prefixes}
    for r in run.requests:
        if r.prefix in out and r.engine is not None:
            out[r.prefix][r.engine] = out[r.prefix].get(r.engine, 0) + 1
    return out


def timeline_report(out_dir: Path, arm_name: str, seed: int, bin_s: float = 2.0, top: int = 4) -> str:
    """A real-time run's per-engine running/waiting over time and who served the hottest prefixes, beside its
    DES twin's: where the two modes part (e.g. one engine reaching max_num_seqs in one of them only)."""
    workload, service, engines, sample_interval_s = run_setup(out_dir)
    arm = arm_by_name(arm_name)
    if arm.kind != "sidecar":
        raise ValueError(f"{arm_name} is a peer arm: it has no DES twin")
    twin = twin_run(des.prepare(build(workload, seed), service.block_size), service, engines, arm, seed,
                    sample_interval_s)
    lines = []
    for mode, run in (("real time", outputs.load_run(out_dir, arm_name, seed)), ("DES twin", twin)):
        lines.append(f"{mode}: {arm_name} seed {seed}, per engine: mean running / waiting per {bin_s:g} s")
        for b, row in engine_timeline(run, bin_s).items():
            lines.append(f"  {b * bin_s:5.0f}s  " + "  ".join(f"{e} {r:3.0f}/{w:3.0f}" for e, (r, w) in row.items()))
        for prefix, served in prefix_servers(run, range(top)).items():
            lines.append(f"  prefix {prefix} served by " + ", ".join(f"{e} x{n}" for e, n in served.items()))
    return "\n".join(lines)


def twin_of_run(out_dir: Path) -> dict[str, dict[int, SeedMetrics]]:
    """Simulate the twin of a finished real-time run (from its config.json) and write des_twin.csv."""
    workload, service, engines, sample_interval_s = run_setup(out_dir)
    per_seed = outputs.load_per_seed(out_dir)
    arms = [arm_by_name(a) for a in per_seed]
    seeds = sorted({s for rows in per_seed.values() for s in rows})
    twin = simulate_twin(workload, service, engines, arms, seeds, sample_interval_s)
    path = out_dir / TWIN_CSV
    path.unlink(missing_ok=True)
    for rows in twin.values():
        for seed in sorted(rows):
            outputs.append_seed_metrics_to(path, rows[seed])
    return twin


def agreement(real: dict[str, dict[int, SeedMetrics]], twin: dict[str, dict[int, SeedMetrics]],
              metrics: Sequence[str] = COMPARED) -> dict[str, dict[str, tuple[float, float, float]]]:
    """{arm: {metric: (real median, DES median, median over seeds of |real - DES| / DES)}} on shared seeds."""
    out: dict[str, dict[str, tuple[float, float, float]]] = {}
    for arm, trows in twin.items():
        rrows = real.get(arm, {})
        seeds = sorted(set(rrows) & set(trows))
        if not seeds:
            continue
        out[arm] = {}
        for m in metrics:
            r = np.array([getattr(rrows[s], m) for s in seeds], dtype=float)
            t = np.array([getattr(trows[s], m) for s in seeds], dtype=float)
            ok = np.isfinite(r) & np.isfinite(t) & (t != 0)
            rel = np.abs(r[ok] - t[ok]) / np.abs(t[ok])
            out[arm][m] = (float(np.median(r)), float(np.median(t)), float(np.median(rel)) if ok.any() else math.nan)
    return out


DES_ARMS = ("kvaware,loadaware-b0,loadaware-b0.5,loadaware-b1.0,loadaware-b2.0,roundrobin,leastload,"
            "loadaware-b0.5-kvev,loadaware-b1.0-kvev,loadaware-b2.0-kvev,kvaware-kvev")


def des_points(points: Sequence[str], arms: Sequence[RealArm], seeds: Sequence[int], out: Path) -> None:
    """The real-time arm set in the DES, per operating point, into out/per_seed.csv (des_run's layout)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / outputs.PER_SEED
    path.unlink(missing_ok=True)
    for name in points:
        p = point_by_name(name)
        res = simulate_twin(p.workload, p.service, p.engines, arms, seeds)
        label = "reference" if name == "reference" else f"second:engines={p.engines},rate={p.workload.rate:g}"
        for arm in res:
            for seed in sorted(res[arm]):
                outputs.append_seed_metrics_to(path, res[arm][seed], {"point": label})


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiment.realtime.crosscheck", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    tw = sub.add_parser("twin", help="simulate the twin of a real-time run and compare")
    tw.add_argument("run", type=Path, help="a real-time run directory (with config.json and per_seed.csv)")
    tl = sub.add_parser("timeline", help="one (arm, seed) of a real-time run beside its twin, engine by engine")
    tl.add_argument("run", type=Path)
    tl.add_argument("--arm", required=True)
    tl.add_argument("--seed", type=int, required=True)
    tl.add_argument("--bin-s", type=float, default=2.0)
    tl.add_argument("--top-prefixes", type=int, default=4, help="who served each of the N hottest prefixes")
    ds = sub.add_parser("des", help="the real-time arm set (KV-events arms included) in the DES")
    ds.add_argument("--points", default="reference,queueing")
    ds.add_argument("--arms", default=DES_ARMS)
    ds.add_argument("--seeds", default="1-20")
    ds.add_argument("--out", type=Path, default=Path("out/experiment/des-kvev"))
    args = ap.parse_args(argv)
    if args.cmd == "des":
        from experiment.realtime.driver import parse_seeds

        des_points(args.points.split(","), parse_arms(args.arms), parse_seeds(args.seeds), args.out)
        print(f"wrote {args.out / outputs.PER_SEED}")
        return 0
    if args.cmd == "timeline":
        print(timeline_report(args.run, args.arm, args.seed, args.bin_s, args.top_prefixes))
        return 0
    twin = twin_of_run(args.run)
    real = outputs.load_per_seed(args.run)
    for arm, rows in agreement(real, twin).items():
        print(f"{arm:<22} " + "  ".join(f"{m} rt {r:.4g} des {t:.4g} (|d| {d:.0%})" for m, (r, t, d) in rows.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
