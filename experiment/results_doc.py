"""docs/results.md and its PNGs, generated in one command from the outputs of finished runs.

    python -m experiment.results_doc \\
        --des out/experiment/des --des-single out/experiment/des-single \\
        --realtime out/experiment/realtime-reference --realtime-queueing out/experiment/realtime-queueing \\
        --out docs

Inputs (any may be missing; its sections then say so):
- `--des`: `python -m experiment.des_run` with multi-holder credit (the reference's patched lookup, and
  what the KV-events source gives): per_seed.csv with the reference point, the second (queueing) point and
  the beta sweep;
- `--des-single`: the same with `--credit single` (stock LMCache, what the sidecar's lmcache source sees);
- `--realtime`, `--realtime-queueing`: `python -m experiment.realtime.driver` runs (config.json,
  per_seed.csv, every request and scrape, CPU and wall times per run) and their DES twins
  (`python -m experiment.realtime.crosscheck`, des_twin.csv; computed here if absent).

Tables and paired tests are formatted by `experiment.report` (the same code the DES report uses), so both
modes are analysed identically; this module only gathers, pairs and explains.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from experiment import report
from experiment.metrics import SeedMetrics, median_of
from experiment.realtime import outputs
from experiment.realtime.arms import arm_by_name
from experiment.realtime.crosscheck import TWIN_CSV, agreement, twin_of_run
from experiment.records import RunRecords
from experiment.stats import median_difference, paired_comparison, spearman

Results = dict[str, list[SeedMetrics]]
SLO_S = 0.150


# ---- loading -------------------------------------------------------------------------------------------
def load_des(path: Path | None) -> dict[str, Results]:
    """{point: {arm: [SeedMetrics by seed]}} from a des_run per_seed.csv ({} if absent)."""
    if path is None:
        return {}
    csv_path = path / "per_seed.csv" if path.is_dir() else path
    if not csv_path.exists():
        return {}
    names = [f.name for f in fields(SeedMetrics)]
    acc: dict[str, dict[str, list[SeedMetrics]]] = defaultdict(lambda: defaultdict(list))
    with csv_path.open() as fh:
        for row in csv.DictReader(fh):
            m = SeedMetrics(**{n: outputs._typed(n, row[n]) for n in names})
            acc[row.get("point", "reference")][m.arm].append(m)
    return {p: {a: sorted(ms, key=lambda m: m.seed) for a, ms in arms.items()} for p, arms in acc.items()}


def paired_on_common_seeds(per_seed: Mapping[str, Mapping[int, SeedMetrics]],
                           arms: Sequence[str] | None = None) -> tuple[Results, list[int]]:
    """Lists in seed order over the seeds every listed arm has (paired tests need the same seeds)."""
    arms = [a for a in (arms or list(per_seed)) if a in per_seed]
    common = sorted(set.intersection(*(set(per_seed[a]) for a in arms))) if arms else []
    return {a: [per_seed[a][s] for s in common] for a in arms}, common


def run_infos(run: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(run.glob("runs/*/seed-*/run.json"))]


# ---- small formatting helpers --------------------------------------------------------------------------
def _f(v: float, d: int = 3) -> str:
    return report._f(v, d)


def _arm_rank(name: str) -> tuple[int, float, str]:
    """kvaware, loadaware by β, the load-only arms, then the same with KV-events credit, then the peers."""
    try:
        arm = arm_by_name(name)
    except ValueError:
        return (10, 0.0, name)
    if arm.kind == "peer":
        return (8 if arm.peer == "sglang-router" else 9, 0.0, name)
    group = {"kvaware": 0, "loadaware": 1, "roundrobin": 2, "leastload": 3}.get(arm.policy, 10)
    kvev = 4 if arm.prefix_source == "kv-events" and group < 4 else 0
    return (group + kvev, arm.beta if arm.policy == "loadaware" else 0.0, name)


def _order(arms: Sequence[str]) -> list[str]:
    return sorted(arms, key=_arm_rank)


def _ordered(res: Results) -> Results:
    return {a: res[a] for a in _order(list(res))}


def effect_line(res: Results, arm: str, base: str, metric: str) -> tuple[float, float, float, float]:
    """(median paired change, CI low, CI high, one-sided p) of `metric`, arm vs base (NaNs if unavailable)."""
    if arm not in res or base not in res or not res[arm]:
        return (math.nan,) * 4
    c = paired_comparison(metric, arm, base, [getattr(m, metric) for m in res[arm]],
                          [getattr(m, metric) for m in res[base]])
    return c.effect.median, c.effect.ci_low, c.effect.ci_high, c.test.pvalue


def hit_points(res: Results, arm: str, base: str) -> float:
    """Median paired difference of prefix hit rate, in points (as experiment.report's paired tables)."""
    if arm not in res or base not in res:
        return math.nan
    return 100 * median_difference([m.prefix_hit_rate for m in res[arm]],
                                   [m.prefix_hit_rate for m in res[base]]).median


# ---- sections ------------------------------------------------------------------------------------------
def targets_section(modes: Mapping[str, tuple[Results, str]],
                    queueing: Mapping[str, tuple[Results, list[str]]]) -> list[str]:
    lines = ["## Targets at a glance", "",
             "Reference point target: loadaware β = 0.5 cuts imbalance by ≥ 40% against kvaware (one-sided exact "
             "Wilcoxon p < 0.025) while losing ≤ 1 point of prefix hit rate.", "",
             "| mode (prefix credit) | seeds | imbalance change [95% CI] | p | hit rate change | met |",
             "|---|---|---|---|---|---|"]
    for label, (res, arm) in modes.items():
        if arm not in res or "kvaware" not in res:
            continue
        med, lo, hi, p = effect_line(res, arm, "kvaware", "imbalance")
        hp = hit_points(res, arm, "kvaware")
        met = med <= -0.40 and p < 0.025 and hp >= -1.0
        lines.append(f"| {label} | {len(res[arm])} | {report._pct(med)} [{report._pct(lo)}, {report._pct(hi)}] "
                     f"| {report._p(p)} | {hp:+.2f} pts | {'**yes**' if met else '**no**'} |")
    lines += ["", "Queueing point target: loadaware beats kvaware and both peers on TTFT p95 (p < 0.025).", "",
              "| mode | loadaware arm | vs | seeds | TTFT p95 change [95% CI] | p | met |",
              "|---|---|---|---|---|---|---|"]
    for label, (res, arms) in queueing.items():
        for arm in arms:
            for base in ("kvaware", "sglang-router", "vllm-router", "roundrobin"):
                if arm not in res or base not in res:
                    continue
                med, lo, hi, p = effect_line(res, arm, base, "ttft_p95")
                lines.append(f"| {label} | {arm} | {base} | {len(res[arm])} | {report._pct(med)} "
                             f"[{report._pct(lo)}, {report._pct(hi)}] | {report._p(p)} "
                             f"| {'**yes**' if med < 0 and p < 0.025 else '**no**'} |")
    verdicts = [queueing_verdict(label, res, arm) for label, (res, arms) in queueing.items() for arm in arms
                if arm in res]
    if verdicts:
        lines += ["", "Per loadaware arm, the whole target (beats kvaware *and* both peers, each at p < 0.025; the "
                  "DES has no peers, so there it is judged against kvaware and roundrobin only):", ""]
        lines += [f"- {v}" for v in verdicts]
    return lines + [""]


def queueing_verdict(label: str, res: Results, arm: str) -> str:
    bases = [b for b in ("kvaware", "sglang-router", "vllm-router", "roundrobin") if b in res]
    lost = []
    for base in bases:
        med, _, _, p = effect_line(res, arm, base, "ttft_p95")
        if not (med < 0 and p < 0.025):
            lost.append(f"{base} ({report._pct(med)}, p = {report._p(p)})")
    peers_missing = [b for b in ("sglang-router", "vllm-router") if b not in res]
    verdict = "**met**" if not lost and not peers_missing else ("**not met**" if lost else "met where measured")
    detail = f"not beaten at p < 0.025: {', '.join(lost)}" if lost else f"beats {', '.join(bases)}"
    return f"{label}, {arm} ({_n(res)} seeds): {verdict}; {detail}."


def calibration_section(des_ref: Results, rt_ref: Results, twin_ref: Results) -> list[str]:
    lines = ["## Calibration against the reference", "",
             "Fitted on the kvaware and roundrobin arms only (the loadaware arms are results, not fit targets); "
             "parameters and the reason for each are in `experiment/calibration.py`. The last column is the "
             "discrete-event twin on the real-time run's own seeds: a real-time value outside its band that the "
             "twin shares comes from which seeds were run, not from the mode.", ""]
    cols = [("DES, 20 seeds", des_ref), ("real time", rt_ref), ("DES on the real-time seeds", twin_ref)]
    checks = [{w: (v, t, ok) for w, v, t, ok in report.calibration_checks(res)} if res else {} for _, res in cols]
    whats = next((list(c) for c in checks if c), [])
    lines += ["| quantity (median of seeds) | reference target | " + " | ".join(n for n, _ in cols) + " |",
              "|---|---|" + "---|" * len(cols)]
    for w in whats:
        target = next(c[w][1] for c in checks if w in c)
        cells = [f"{_f(c[w][0])}{'' if c[w][2] else ' (outside)'}" if w in c else "–" for c in checks]
        lines.append(f"| {w} | {target} | " + " | ".join(cells) + " |")
    return lines + [""]


def twin_results(rt_dir: Path) -> dict[str, dict[int, SeedMetrics]]:
    """The DES twin of a real-time run (des_twin.csv, recomputed when the run has pairs it lacks)."""
    real = outputs.load_per_seed(rt_dir)
    twin_path = rt_dir / TWIN_CSV
    twin = outputs.load_per_seed(twin_path) if twin_path.exists() else {}
    wanted = {(a, s) for a, rows in real.items() if arm_by_name(a).kind == "sidecar" for s in rows}
    if not wanted <= {(a, s) for a, rows in twin.items() for s in rows}:
        twin = twin_of_run(rt_dir)  # absent, or older than the run's latest seeds
    return twin


def cpu_section(infos: Sequence[dict[str, Any]], label: str) -> list[str]:
    if not infos:
        return []
    procs = sorted({k for i in infos for k in i.get("cpu_share", {})})
    lines = [f"**{label}: machine load.** {len(infos)} runs; median CPU share of one core per process over each "
             "run's sender wall time (2 cores in all, shared with other work):", "",
             "| arm kind | " + " | ".join(procs) + " | sender launch lag p99 ms | run wall s |",
             "|---|" + "---|" * (len(procs) + 2)]
    for kind in ("sidecar", "peer"):
        sub = [i for i in infos if i.get("router") == kind]
        if not sub:
            continue
        shares = [f"{100 * float(np.median([i['cpu_share'].get(p, 0.0) for i in sub])):.0f}%" for p in procs]
        lines.append(f"| {kind} | " + " | ".join(shares) + f" | {np.median([i['launch_lag_p99_ms'] for i in sub]):.1f} "
                     f"| {np.median([i['total_s'] for i in sub]):.0f} |")
    return lines + [""]


def agreement_section(rt_dir: Path, label: str) -> list[str]:
    real = outputs.load_per_seed(rt_dir)
    agree = agreement(real, twin_results(rt_dir))
    if not agree:
        return []
    metrics = ("imbalance", "prefix_hit_rate", "ttft_mean", "ttft_p95", "itl_p50")
    seeds = sorted({s for rows in real.values() for s in rows})
    lines = [f"### {label}: real time vs its discrete-event twin", "",
             f"Same seeds ({', '.join(map(str, seeds))}), same workload and service model; the twin's router "
             "refines its in-flight counts with 1 s scrapes like the sidecar, and lmcache arms get "
             "single-holder credit, KV-events arms are credited from every engine's GPU prefix cache. Cells: "
             "real time / DES (median over the seeds both have) and the median per-seed relative difference.", "",
             "| arm | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
    for arm in _order(list(agree)):
        cells = []
        for m in metrics:
            r, t, d = agree[arm][m]
            scale, dg = (1000, 1) if m == "itl_p50" else (1, 3)
            cells.append(f"{_f(r * scale, dg)} / {_f(t * scale, dg)} ({_f(100 * d, 0)}%)")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines + ["", agreement_summary(agree, metrics), ""]


def agreement_summary(agree: Mapping[str, Mapping[str, tuple[float, float, float]]], metrics: Sequence[str]) -> str:
    """One sentence: how far the modes are apart per cell, and whether they order the arms alike."""
    cells = [(agree[a][m][2], a, m) for a in agree for m in metrics if not math.isnan(agree[a][m][2])]
    if not cells:
        return ""
    diffs = sorted(abs(d) for d, _, _ in cells)
    worst = max(cells, key=lambda c: abs(c[0]))
    orders = []
    for m in ("imbalance", "ttft_p95"):
        pairs = [(agree[a][m][0], agree[a][m][1]) for a in agree]
        if len(pairs) >= 3:
            rho = spearman([r for r, _ in pairs], [t for _, t in pairs])
            orders.append(f"{m} ρ = {rho:.2f}")
    return (f"Agreement: over {len(agree)} arms × {len(metrics)} metrics the median per-seed relative difference "
            f"is {100 * float(np.median(diffs)):.0f}% (90th percentile {100 * float(np.quantile(diffs, 0.9)):.0f}%, "
            f"largest {100 * abs(worst[0]):.0f}%: {worst[1]} {worst[2]}); the two modes rank the arms alike "
            f"(Spearman over the arms' medians: {', '.join(orders)}).")


def running_rounds(run: RunRecords) -> tuple[list[float], dict[str, list[float]]]:
    """Per-engine running over the window, one point per scrape round. The sender scrapes the engines
    concurrently, so one round's samples carry slightly different times: a round ends when an engine
    repeats, and takes its earliest time."""
    lo, hi = run.window
    engines = sorted({s.engine for s in run.samples})
    ts: list[float] = []
    per: dict[str, list[float]] = {e: [] for e in engines}
    current: dict[str, float] = {}
    t_round = 0.0
    for s in sorted((s for s in run.samples if lo <= s.t <= hi), key=lambda s: s.t):
        if s.engine in current:
            if len(current) == len(engines):
                ts.append(t_round)
                for e in engines:
                    per[e].append(current[e])
            current = {}
        if not current:
            t_round = s.t
        current[s.engine] = s.running
    if len(current) == len(engines):
        ts.append(t_round)
        for e in engines:
            per[e].append(current[e])
    return ts, per


def plots_realtime(rt_dir: Path, out: Path, stem: str, title: str, res: Results) -> list[str]:
    made = []
    report.plot_imbalance(res, out / f"{stem}_imbalance.png", f"Imbalance per arm, real time ({title})")
    made.append(f"![imbalance, real time]({stem}_imbalance.png)")
    ttfts = {}
    for arm in res:
        vals = []
        for m in res[arm]:
            rec = outputs.load_run(rt_dir, arm, m.seed)
            vals += [r.ttft for r in rec.requests if r.ok and r.ttft is not None]
        ttfts[arm] = np.array(vals)
    report.plot_ttft_cdf(ttfts, out / f"{stem}_ttft_cdf.png", f"TTFT CDF, real time ({title})", SLO_S)
    made.append(f"![TTFT CDF, real time]({stem}_ttft_cdf.png)")
    seed = min(m.seed for ms in res.values() for m in ms) if res else None
    wanted: list[str] = [a for a in ("kvaware", "loadaware-b0.5", "loadaware-b0.5-kvev", "loadaware-b1.0-kvev",
                                     "roundrobin", "sglang-router", "vllm-router") if a in res]
    if seed is not None and wanted:
        series = {a: running_rounds(outputs.load_run(rt_dir, a, seed)) for a in wanted}
        report.plot_running(series, out / f"{stem}_running.png",
                            f"Running requests per engine, real time, seed {seed} ({title})")
        made.append(f"![running per engine, real time]({stem}_running.png)")
    return made


# ---- the document --------------------------------------------------------------------------------------
def _rt(path: Path | None) -> tuple[Path | None, Results, list[int]]:
    if path is None or not (path / outputs.PER_SEED).exists():
        return None, {}, []
    res, seeds = paired_on_common_seeds(outputs.load_per_seed(path))
    return path, _ordered(res), seeds


def _n(res: Results) -> int:
    return len(next(iter(res.values()))) if res else 0


def build_doc(args: argparse.Namespace) -> str:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    des = load_des(args.des)
    des_ref = _ordered(des.get("reference", {}))
    des_single = _ordered(load_des(args.des_single).get("reference", {}))
    kv = load_des(args.des_kvev)
    kv_ref = _ordered(kv.get("reference", {}))
    kv_q_key = next((k for k in kv if k.startswith("second:")), None)
    kv_q = _ordered(kv.get(kv_q_key, {})) if kv_q_key else {}
    rt_dir, rt_ref, rt_seeds = _rt(args.realtime)
    rtq_dir, rt_q, rtq_seeds = _rt(args.realtime_queueing)
    second_key = next((k for k in des if k.startswith("second:")), None)
    des_q = _ordered(des.get(second_key, {})) if second_key else {}
    sweep = sweep_cells(des)

    command = " ".join(shlex.quote(a) for a in sys.argv[1:])
    md: list[str] = ["# Results: the reference experiment on a simulated fleet, with the peer routers", "",
                     f"Generated by `python -m experiment.results_doc {command}` "
                     f"on {time.strftime('%Y-%m-%d')}. Every number and plot below is computed from the run outputs "
                     "named in that command; only the prose is written by hand.", ""]
    md += how_section()

    # targets
    modes: dict[str, tuple[Results, str]] = {}
    if des_ref:
        modes["DES, multi-holder credit over the LMCache stores (des_run)"] = (des_ref, "loadaware-b0.5")
    if kv_ref:
        modes["DES, single-holder credit (stock LMCache)"] = (kv_ref, "loadaware-b0.5")
        modes["DES, KV-events credit (every GPU-cache holder)"] = (kv_ref, "loadaware-b0.5-kvev")
    elif des_single:
        modes["DES, single-holder credit (stock LMCache)"] = (des_single, "loadaware-b0.5")
    if rt_ref:
        modes["real time, lmcache source"] = (rt_ref, "loadaware-b0.5")
        modes["real time, kv-events source"] = (rt_ref, "loadaware-b0.5-kvev")
    queueing: dict[str, tuple[Results, list[str]]] = {}
    if kv_q:
        queueing["DES"] = (kv_q, ["loadaware-b0.5-kvev", "loadaware-b1.0-kvev", "loadaware-b1.0"])
    if rt_q:
        queueing["real time"] = (rt_q, [a for a in ("loadaware-b0.5-kvev", "loadaware-b1.0-kvev", "loadaware-b0.5",
                                                    "loadaware-b1.0") if a in rt_q])
    md += targets_section(modes, queueing)
    twin_ref: Results = {}
    if rt_dir is not None:
        twin_ref, _ = paired_on_common_seeds(twin_results(rt_dir))
    md += calibration_section(des_ref or kv_ref, rt_ref, twin_ref)

    # reference table
    md += ["## The reference table, reproduced", ""]
    if des_ref:
        md += [f"### Discrete-event mode, {_n(des_ref)} seeds, multi-holder credit over the LMCache stores "
               "(`experiment.des_run`)", "", report.arm_table(des_ref, True), ""]
    if kv_ref:
        md += [f"### Discrete-event mode, {_n(kv_ref)} seeds, the real-time arm set (lmcache arms: single-holder "
               "credit; `-kvev` arms: KV-events credit; router scrapes every 1 s like the sidecar)", "",
               report.arm_table(kv_ref, True), ""]
    elif des_single:
        md += [f"### Discrete-event mode, {_n(des_single)} seeds, single-holder credit (stock LMCache)", "",
               report.arm_table(des_single, False), ""]
    if rt_ref and rt_dir is not None:
        md += [f"### Real time, {len(rt_seeds)} seeds ({', '.join(map(str, rt_seeds))}), all arms and both peers", "",
               report.arm_table(rt_ref, True), ""]
        md += plots_realtime(rt_dir, out, "rt_reference", "reference point", rt_ref) + [""]
    if des_ref and args.des:
        for png in ("imbalance.png", "ttft_cdf.png", "running.png"):
            src = args.des / png
            if src.exists():
                (out / f"des_{png}").write_bytes(src.read_bytes())
                md.append(f"![DES {png}](des_{png})")
        md.append("")

    # paired tests
    md += ["## Paired tests against kvaware", "",
           "One-sided exact Wilcoxon signed-rank on the paired per-seed values (α = 0.025); effect = median paired "
           "relative change with a seeded bootstrap 95% CI; the hit-rate row is the median paired difference in "
           "points. With n paired seeds the smallest attainable p is 2^-n: real-time runs need at least 6 seeds "
           "before any test can reach p < 0.025.", ""]
    for label, res, arms in (("DES, multi-holder credit over the LMCache stores", des_ref,
                              ["loadaware-b0.5", "loadaware-b1.0"]),
                             ("DES, real-time arm set", kv_ref, ["loadaware-b0.5", "loadaware-b1.0",
                                                                "loadaware-b0.5-kvev", "loadaware-b1.0-kvev"]),
                             ("Real time", rt_ref, ["loadaware-b0.5", "loadaware-b1.0", "loadaware-b0.5-kvev",
                                                    "loadaware-b1.0-kvev"])):
        if res and "kvaware" in res:
            md += [f"### {label} ({_n(res)} seeds)", "", report.paired_table(res, [a for a in arms if a in res]), ""]

    md += kv_events_section(des_ref, kv_ref, rt_ref)

    # queueing point
    md += ["## Second operating point: a fleet that queues", "",
           "4 engines at 40 req/s (`experiment.calibration.QUEUEING_*`): 10 req/s per engine against 8 at the "
           "reference point. Under kvaware the engine holding the hottest prefixes runs at `max_num_seqs` and "
           "queues while others idle, so placement can cut latency.", ""]
    if kv_q:
        md += [f"### Discrete-event mode, {_n(kv_q)} seeds, real-time arm set", "", report.arm_table(kv_q), "",
               report.paired_table(kv_q, queueing["DES"][1], metrics=("ttft_p95", "slo_miss", "imbalance")), "",
               report.paired_table(kv_q, queueing["DES"][1], base="roundrobin", metrics=("ttft_p95", "slo_miss")), ""]
    elif des_q and second_key:
        md += [f"### Discrete-event mode ({second_key.split(':', 1)[1]}, multi-holder credit)", "",
               report.arm_table(des_q), "",
               report.paired_table(des_q, ["loadaware-b0.5", "loadaware-b1.0"], metrics=("ttft_p95", "slo_miss")), ""]
    if rt_q and rtq_dir is not None:
        cfg = outputs.load_config(rtq_dir)["point"]
        md += [f"### Real time ({cfg['engines']} engines, {cfg['workload']['rate']:g} req/s, {len(rtq_seeds)} seeds: "
               f"{', '.join(map(str, rtq_seeds))})", "", report.arm_table(rt_q), ""]
        la = queueing["real time"][1]
        for base in ("kvaware", "roundrobin", "sglang-router", "vllm-router"):
            if base in rt_q:
                md += [report.paired_table(rt_q, la, base=base, metrics=("ttft_p95", "slo_miss", "ttft_mean")), ""]
        md += plots_realtime(rtq_dir, out, "rt_queueing", "queueing point", rt_q) + [""]

    if sweep:
        md += sweep_section(sweep, out)

    md += ["## Do the two modes agree?", ""]
    for d, label in ((rt_dir, "Reference point"), (rtq_dir, "Queueing point")):
        if d is not None:
            md += agreement_section(d, label)

    md += ["## Machine load and wall time", ""]
    for d, label in ((rt_dir, "Reference point"), (rtq_dir, "Queueing point")):
        if d is not None:
            md += cpu_section(run_infos(d), label)
    md += wall_section(rt_dir, rtq_dir, args)
    grid = getattr(args, "grid", None)
    if grid is not None and (grid / "report.md").exists():  # python -m experiment.grid's section, as written
        md += [(grid / "report.md").read_text().rstrip(), ""]
    md += ["## Research notes", "",  # the lab notebook is its own file: linked, never pasted
           "The hand-written findings, in the order they were made (what was tried, what it showed, what was kept), "
           "are\nthe lab notebook: [research/notebook.md](../research/notebook.md).", ""]
    return "\n".join(md) + "\n"


def how_section() -> list[str]:
    return ["## How it was run", "",
            "- **Discrete-event mode**: the simulated engines' model (`sim/`, calibrated in "
            "`experiment/calibration.py`) and the sidecar's own policy and load code, no network, 20 seeds. Two "
            "runs: `experiment.des_run` (every sidecar arm, multi-holder credit read from the engines' LMCache "
            "stores, the second point and the β sweep) and `experiment.realtime.crosscheck des` (the real-time "
            "arm set: lmcache arms with stock single-holder credit, `-kvev` arms credited from each engine's GPU "
            "prefix cache, which is what the engines publish as KV events, and the router refining its counts "
            "with 1 s scrapes as the sidecar does).",
            "- **Real-time mode** (`make experiment`, `python -m experiment.realtime.driver`): the real stack on "
            "loopback: a real LMCache 0.5.6 controller, simulated vLLM engines on 127.0.0.2.. running the same "
            "calibrated model, the real Envoy 1.40 with the shipped config (engines cluster rewritten to the "
            "fleet) and the real sidecar; the peers (sglang-router 0.3.2, vllm-router 0.1.17, "
            "`--policy cache_aware`, default thresholds) in front of the same engines. An open-loop sender in its "
            "own process; engine `/metrics` scraped every 0.5 s; two warm-up passes through the router under "
            "test; caches reset and the router restarted for every (arm, seed); seeds paired across arms.",
            "- Arms named `…-kvev` use `--prefix-source kv-events` (the engines' KV events: every holder "
            "credited, and an engine that evicts a prefix stops being its holder); the others "
            "`--prefix-source lmcache` (the stock controller: one holder per chunk, and its CPU store never "
            "evicts at this scale).", ""]


def kv_events_section(des_ref: Results, kv_ref: Results, rt_ref: Results) -> list[str]:
    lines = ["## Multi-holder credit (KV events) next to stock LMCache", "",
             "Three ways to say who holds a prompt's prefix, side by side:", "",
             "- **stock LMCache** (`lmcache` arms): each 256-token chunk is credited to its first registered holder "
             "only, and the controller's view follows the engines' CPU stores, which hold every prefix at this "
             "operating point. A request leaves its credited holder only when the holder's relative load exceeds "
             "1/(2β): more than 1 at β = 0.5, which two engines never reach, so β = 0.5 behaves like kvaware.",
             "- **every holder of the LMCache stores** (`experiment.des_run`'s multi-holder credit, the reference's "
             "patched lookup): after a drained warm-up each prefix has one holder, so little changes at β = 0.5.",
             "- **KV events** (`-kvev` arms): the engines publish their GPU prefix cache, evictions included, and "
             "the sidecar credits every engine that holds the blocks now. The calibrated GPU pool (89,800 tokens) "
             "holds about 57 of the 128 prefixes, so prefixes are evicted all the time; an evicted prefix's next "
             "request is placed by load, and a hot prefix soon lives on both engines. Then the load term can "
             "move its traffic at any β.", "",
             "| arm | prefix credit | mode | seeds | imbalance | TTFT p95 s | prefix hit | SLO miss |",
             "|---|---|---|---|---|---|---|---|"]

    def row(res: Results, arm: str, source: str, mode: str) -> None:
        if arm in res:
            ms = res[arm]
            lines.append(f"| {arm.removesuffix('-kvev')} | {source} | {mode} | {len(ms)} "
                         f"| {_f(median_of(ms, 'imbalance'))} | {_f(median_of(ms, 'ttft_p95'))} "
                         f"| {_f(median_of(ms, 'prefix_hit_rate'))} | {_f(median_of(ms, 'slo_miss'))} |")

    from experiment import reference

    for arm in ("kvaware", "loadaware-b0.5", "loadaware-b1.0", "loadaware-b2.0"):
        if arm in reference.TABLE:
            r = reference.TABLE[arm]
            lines.append(f"| {arm} | patched multi-holder lookup | *reference* | 20 | *{r.imbalance:.3f}* "
                         f"| *{r.ttft_p95:.3f}* | *{r.prefix_hit:.3f}* | *{r.slo_miss:.3f}* |")
        row(kv_ref, arm, "stock LMCache (single)", "DES")
        row(des_ref, arm, "LMCache stores, every holder", "DES")
        row(kv_ref, arm + "-kvev", "KV events", "DES")
        row(rt_ref, arm, "stock LMCache (single)", "real time")
        row(rt_ref, arm + "-kvev", "KV events", "real time")
    lines.append("")
    for label, res in (("DES", kv_ref), ("Real time", rt_ref)):
        pairs = [(a + "-kvev", a) for a in ("kvaware", "loadaware-b0.5", "loadaware-b1.0")
                 if a + "-kvev" in res and a in res]
        for kv_arm, base in pairs:
            lines += [f"{label}: {kv_arm} against {base} (same policy, KV-events vs stock LMCache credit), "
                      f"{len(res[base])} seeds:", "",
                      report.paired_table(res, [kv_arm], base=base, metrics=("imbalance", "ttft_p95", "slo_miss")), ""]
    return lines


def sweep_cells(des: Mapping[str, Results]) -> dict[int, dict[float, Results]]:
    """{engines: {rate: results}} from des_run's `sweep:<engines>x<rate>` points (`sweep:<rate>` = 2 engines)."""
    out: dict[int, dict[float, Results]] = defaultdict(dict)
    for key, res in des.items():
        if not key.startswith("sweep:"):
            continue
        cell = key.split(":", 1)[1]
        engines, rate = cell.split("x", 1) if "x" in cell else ("2", cell)
        out[int(engines)][float(rate)] = _ordered(res)
    return dict(sorted(out.items()))


def sweep_section(sweep: dict[int, dict[float, Results]], out: Path) -> list[str]:
    lines = ["## β sweep over utilisation (discrete-event mode, `experiment.des_run`)", "",
             "Multi-holder credit over the LMCache stores, offered rate varied on 2 and 4 engines. The best β "
             "is the loadaware arm with the lowest median TTFT p95 (kvaware and β = 0 coincide: with no load "
             "term loadaware is kvaware).", ""]
    for engines, cells in sweep.items():
        n = len(next(iter(next(iter(cells.values())).values())))
        best = report.best_beta(cells)
        png = f"des_hit_vs_beta_{engines}.png"
        report.plot_hit_vs_beta(cells, out / png, f"β sweep over offered rate (DES, {engines} engines)")
        lines += [f"### {engines} engines, {n} seeds per cell", "",
                  "Median TTFT p95 (s):", "", report.sweep_table(cells, "ttft_p95"), "",
                  "Median SLO miss share:", "", report.sweep_table(cells, "slo_miss"), "",
                  "Median imbalance:", "", report.sweep_table(cells, "imbalance"), "",
                  "Median prefix hit rate:", "",
                  report.sweep_table(cells, "prefix_hit_rate", higher_is_better=True), "",
                  "Best β by TTFT p95: " + ", ".join(f"{r:g} req/s → {a.removeprefix('loadaware-b')}"
                                                    for r, a in sorted(best.items())), "",
                  f"![hit rate and TTFT p95 vs beta, {engines} engines]({png})", ""]
    return lines


def wall_section(rt_dir: Path | None, rtq_dir: Path | None, args: argparse.Namespace) -> list[str]:
    lines = ["**Wall time.**", ""]
    for d, label in ((rt_dir, "reference"), (rtq_dir, "queueing")):
        if d is None:
            continue
        infos = run_infos(d)
        if not infos:
            continue
        per_run = float(np.median([i["total_s"] for i in infos]))
        arms = len({i["arm"] for i in infos})
        seeds = len({i["seed"] for i in infos})
        total = sum(i["total_s"] for i in infos)
        lines.append(f"- Real time, {label} point: {len(infos)} runs ({arms} arms × {seeds} seeds) took "
                     f"{total / 60:.0f} min of run time; median {per_run:.0f} s per (arm, seed), so 20 seeds × "
                     f"{arms} arms ≈ {20 * arms * per_run / 3600:.1f} h.")
    return lines + [""]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiment.results_doc", description=__doc__.split("\n")[0])
    ap.add_argument("--des", type=Path, default=None)
    ap.add_argument("--des-single", type=Path, default=None, help="des_run --credit single (if no --des-kvev)")
    ap.add_argument("--des-kvev", type=Path, default=None, help="experiment.realtime.crosscheck des output")
    ap.add_argument("--grid", type=Path, default=None, help="python -m experiment.grid output (report.md)")
    ap.add_argument("--realtime", type=Path, default=None)
    ap.add_argument("--realtime-queueing", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("docs"))
    args = ap.parse_args(argv)
    doc = build_doc(args)
    (args.out / "results.md").write_text(doc)
    print(f"wrote {args.out / 'results.md'} ({len(doc.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
