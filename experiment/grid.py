"""The placement grid: our policy against the peers' published policies at eight operating points (DES).

    python -m experiment.grid [--seeds 20] [--jobs 2] [--ours lane-spread] [--points a,b] [--arms a,b]
        [--credit multi|gpu] [--out out/experiment/grid] [--doc docs/results.md]

At every point each arm runs the same seeds' workloads (paired); per point, for TTFT p95, TTFT mean and the
SLO-miss share, a one-sided exact Wilcoxon signed-rank test of ours against the best peer at that point by
that metric (median over seeds; peers = experiment.peers' arms), α = 0.025, effect = median paired relative
change with a seeded bootstrap 95% CI. Writes report.md and per_seed.csv to --out and, with --doc, puts the
report between the grid markers of docs/results.md (replacing the previous one).

The points (service model experiment.calibration.CALIBRATED unless said; prefix credit for every arm from
--credit: "multi", the LMCache stores' multi-holder credit, by default; "gpu", each engine's GPU prefix cache
as KV events show it, which is what NVIDIA Dynamo's and llm-d's indexers and the sidecar's kv-events source read):
- reference: the reference workload, 2 engines, 16 req/s Poisson;
- queueing: 4 engines, 40 req/s (the hot prefixes' engine queues under kvaware);
- bursty: 4 engines, 28 req/s mean, MMPP arrivals (3x the mean rate for 20% of the time, ~2 s bursts);
- long-prefix: 8 engines, 56 req/s, 3,000-token shared prefixes (128 of them: 384k tokens of prefixes
  against 718k of GPU cache in the fleet, so the cache holds them only if placement partitions them);
- low-sharing: 2 engines, 4 req/s, 1,024 prefixes instead of 128 (Zipf 0.9): 1.6M tokens of prefixes
  against 180k of GPU cache, so most prefixes are seen rarely and a large share of requests miss;
- multi-turn: 4 engines, 24 req/s, chat with growing context: 16 system prompts of 1,000 tokens, 5 turns
  per conversation, 150-token user messages, each turn resending the history with its 64-token replies;
- heterogeneous: 4 engines, 28 req/s, engine-000 half as fast (prefill at half the rate, decode steps and
  prefill overhead twice as long);
- overload: 2 engines at 21 req/s, 1.3x the ~16.3 req/s the reference fleet sustains at best (measured:
  loadaware and lmetric complete 16.2-16.8 req/s when offered 20-22).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import os
import pickle
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from experiment.arms import Arm, arm_by_name
from experiment.calibration import CALIBRATED
from experiment.des import Credit, FleetConfig, Prepared, prepare, simulate
from experiment.des_run import Point
from experiment.grid_blocks import PEERS, best_peer, block_table, median_over_seeds
from experiment.metrics import DEFAULT_SLO_S, SeedMetrics, seed_metrics
from experiment.report import invoked_as, replace_section
from experiment.stats import PairedComparison, paired_comparison
from experiment.workload import WorkloadSpec, build
from sim.service_model import ServiceModel

GRID_START, GRID_END = "<!-- grid:start -->", "<!-- grid:end -->"
PEER_SOURCES = (
    "- `lmetric`: LMetric, arXiv 2603.15202, as NVIDIA Dynamo ships it (`lmetric` selection): cost = "
    "(uncached prompt tokens queued for prefill + the request's own) x (decode batch + 1), lowest wins; no "
    "parameters.",
    "- `dynamo`: NVIDIA Dynamo KV router's default linear cost (lib/kv-router, router temperature 0): cost = "
    "prefill_load_scale x max(active prefill blocks + incoming blocks - overlap blocks, 0) + active decode "
    "blocks + incoming blocks, prefill_load_scale = 1, overlap credit 1 per cached block, 16-token blocks.",
    "- `llmd-token`: llm-d Router's default since August 2026: `prefix-cache-affinity-filter` (keep endpoints "
    "holding >= 0.8 of the prompt unless they carry more than maxTokensInFlightPenalty = 286,720 uncached "
    "tokens in flight) then `token-load-scorer` (uncached tokens in flight + prompt x (1 - hit), lowest wins).",
    "- `llmd-blend`: llm-d's earlier weighted default: 3 x prefix-cache-scorer (hit fraction) + 2 x queue-scorer "
    "(waiting requests, min-max normalised over the candidates) + 2 x kv-cache-utilization-scorer (1 - KV usage).",
    "- `sglang-cache-aware`: SGLang router `cache_aware` (cache_threshold 0.3, balance_abs_threshold 64, "
    "balance_rel_threshold 1.5): shortest queue when the fleet is imbalanced, else the longest match above 0.3, "
    "else the smallest tree.",
)
METRICS = ("ttft_p95", "ttft_mean", "slo_miss")
BLOCK = 20  # the grid's usual seeds per run: a longer run also reports its 20-seed blocks
BASELINES = ("loadaware",)  # the seed's default (beta 1.0); kvaware decides as llmd-token does here


def half_speed(svc: ServiceModel) -> ServiceModel:
    """The same engine at half the speed: prefill and loads at half the rate, every step twice as long."""
    return replace(svc, prefill_tokens_per_s=svc.prefill_tokens_per_s / 2,
                   lmcache_load_tokens_per_s=svc.lmcache_load_tokens_per_s / 2,
                   decode_base_ms=svc.decode_base_ms * 2, decode_per_seq_ms=svc.decode_per_seq_ms * 2,
                   prefill_overhead_ms=svc.prefill_overhead_ms * 2)


@dataclass(frozen=True)
class GridPoint:
    point: Point
    description: str


def _pt(name: str, description: str, engines: int, services: tuple[ServiceModel, ...] = (),
        **spec: object) -> GridPoint:
    fleet = FleetConfig(engines=engines, service=CALIBRATED, engine_services=services)
    return GridPoint(Point(name, WorkloadSpec(**spec), fleet), description)  # type: ignore[arg-type]


POINTS: tuple[GridPoint, ...] = (
    _pt("reference", "2 engines, 16 req/s Poisson, the reference workload", 2, rate=16.0),
    _pt("queueing", "4 engines, 40 req/s", 4, rate=40.0),
    _pt("bursty", "4 engines, 28 req/s MMPP (3x for 20% of the time)", 4, rate=28.0, arrival="mmpp"),
    _pt("long-prefix", "8 engines, 56 req/s, 3,000-token prefixes", 8, rate=56.0, prefix_tokens=3000),
    _pt("low-sharing", "2 engines, 4 req/s, 1,024 prefixes", 2, rate=4.0, n_prefixes=1024),
    _pt("multi-turn", "4 engines, 24 req/s, 5-turn chats on 16 system prompts", 4, rate=24.0, n_prefixes=16,
        prefix_tokens=1000, suffix_tokens=150, turns=5),
    _pt("heterogeneous", "4 engines (engine-000 half as fast), 28 req/s", 4, (half_speed(CALIBRATED),), rate=28.0),
    _pt("overload", "2 engines, 21 req/s (1.3x capacity)", 2, rate=21.0),
)
POINTS_BY_NAME = {p.point.name: p for p in POINTS}


# ---- running -------------------------------------------------------------------------------------------
def prepared(point: Point, seed: int, cache: Path | None) -> Prepared:
    """The point's workload for `seed`, hashed for the simulator; kept in `cache` (keyed by the workload
    spec and seed) because building it costs several times one arm's simulation."""
    key = hashlib.sha256(repr((point.spec, seed, point.fleet.service.block_size)).encode()).hexdigest()[:16]
    path = cache / f"{point.name}-{seed}-{key}.pkl" if cache is not None else None
    if path is not None and path.exists():
        with path.open("rb") as fh:
            cached: Prepared = pickle.load(fh)  # our own file, written below
            return cached
    out = prepare(build(point.spec, seed), point.fleet.service.block_size)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # two workers may build the same workload at once
        with tmp.open("wb") as fh:
            pickle.dump(out, fh)
        tmp.replace(path)
    return out


def _seed_task(job: tuple[Point, tuple[Arm, ...], int, Path | None]) -> list[SeedMetrics]:
    point, arms, seed, cache = job
    work = prepared(point, seed, cache)
    return [seed_metrics(simulate(work, arm, point.fleet, seed), DEFAULT_SLO_S) for arm in arms]


def run_grid(points: Sequence[GridPoint], arms: Sequence[Arm], seeds: Sequence[int], jobs: int,
             cache: Path | None) -> dict[str, dict[str, list[SeedMetrics]]]:
    """{point: {arm: [SeedMetrics by seed]}}; one task per (point, seed), over `jobs` processes."""
    tasks = [(gp.point, tuple(arms), s, cache) for gp in points for s in seeds]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            done = list(pool.map(_seed_task, tasks))
    else:
        done = [_seed_task(t) for t in tasks]
    out: dict[str, dict[str, list[SeedMetrics]]] = {gp.point.name: {a.name: [] for a in arms} for gp in points}
    for (point, _, _, _), row in zip(tasks, done):
        for arm, m in zip(arms, row):
            out[point.name][arm.name].append(m)
    return out


# ---- analysis ------------------------------------------------------------------------------------------
DESIGN_SEEDS = (1, 10)  # the seeds the policies were designed on
TUNING_SEEDS = (201, 220)  # the seeds lane's power and lane-spread's gate were chosen on (research/notebook.md)
DEFAULT_REQUESTS = WorkloadSpec().n_requests


def against_best_peer(res: Mapping[str, Sequence[SeedMetrics]], ours: str,
                      metrics: Sequence[str] = METRICS) -> dict[str, PairedComparison]:
    out = {}
    for metric in metrics:
        peer = best_peer(res, metric)
        out[metric] = paired_comparison(metric, ours, peer, [getattr(m, metric) for m in res[ours]],
                                        [getattr(m, metric) for m in res[peer]])
    return out


def _cell(v: float) -> str:
    return "–" if v != v else f"{v:.3f}"


def _cmp(c: PairedComparison) -> str:
    e = c.effect
    mark = "**" if c.significant() else ""
    return (f"{mark}{e.median * 100:+.1f}%{mark} [{e.ci_low * 100:+.1f}, {e.ci_high * 100:+.1f}] "
            f"p={c.test.pvalue:.4f} vs {c.base}")


CREDIT_SEEN = {
    "multi": "prefix matches from the multi-holder LMCache-store credit (as for the seed's arms)",
    "gpu": "prefix matches from every engine's own GPU prefix cache, evictions included (KV-events credit, as "
           "Dynamo's and llm-d's indexers and the sidecar's kv-events source see it)",
}


def with_credit(gp: GridPoint, credit: Credit) -> GridPoint:
    return replace(gp, point=replace(gp.point, fleet=replace(gp.point.fleet, credit=credit)))


def with_requests(gp: GridPoint, n_requests: int) -> GridPoint:
    """The point with `n_requests` measured requests per seed (its warm-up unchanged)."""
    return replace(gp, point=replace(gp.point, spec=replace(gp.point.spec, n_requests=n_requests)))


def _seed_role(first_seed: int, seeds: int) -> str:
    """Whether the seeds are held out from the ones the policies were designed (1-10) and tuned (201-220) on."""
    last = first_seed + seeds - 1
    for (lo, hi), what in ((DESIGN_SEEDS, "design"), (TUNING_SEEDS, "tuning")):
        if first_seed <= hi and last >= lo:
            return f"they overlap the {what} seeds {lo}-{hi}, so this is not a held-out test"
    return "held out: the policies were designed on seeds 1-10 and tuned on 201-220"


def report(results: Mapping[str, Mapping[str, Sequence[SeedMetrics]]], ours: str, arms: Sequence[str],
           seeds: int, command: str, wall_s: float, jobs: int, first_seed: int = 1, credit: Credit = "multi",
           requests: int = DEFAULT_REQUESTS) -> str:
    lines = [GRID_START, "## The placement grid (discrete-event mode, `experiment.grid`)", "",
             f"{seeds} paired seeds per point (seeds {first_seed}-{first_seed + seeds - 1}: "
             f"{_seed_role(first_seed, seeds)}), {requests:,} measured requests per seed; medians over seeds. Ours = "
             f"`{ours}`. Every test is one-sided exact Wilcoxon of ours against the best peer at that point by "
             "that metric (α = 0.025; effect = median paired relative change, bootstrap 95% CI; bold = "
             "significant). Peers: " + ", ".join(f"`{p}`" for p in PEERS) + " (formulas and sources in "
             "`experiment/peers.py` and below); baseline: `loadaware` (the seed's default, β = 1.0; `kvaware` is "
             "left out: here it decides as `llmd-token` does, whose filter always keeps the holder).", ""]
    for metric, title in (("ttft_p95", "TTFT p95 (s)"), ("ttft_mean", "TTFT mean (s)"),
                          ("slo_miss", "SLO-miss share (TTFT > 150 ms)")):
        lines += [f"### {title}, median over seeds", "", "| point | " + " | ".join(arms) + " |",
                  "|---|" + "---|" * len(arms)]
        for name, res in results.items():
            meds = {a: median_over_seeds([getattr(m, metric) for m in res[a]]) for a in arms if a in res}
            best = min(meds.values())
            cells = [(f"**{_cell(meds[a])}**" if meds[a] == best else _cell(meds[a])) if a in meds else "–"
                     for a in arms]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["### Ours against the best peer at each point", "",
              "| point | TTFT p95 | TTFT mean | SLO misses | wins (p < 0.025) |", "|---|---|---|---|---|"]
    wins = 0
    for name, res in results.items():
        cmp = against_best_peer(res, ours)
        n = sum(c.significant() for c in cmp.values())
        wins += cmp["ttft_p95"].significant()
        lines.append(f"| {name} | " + " | ".join(_cmp(cmp[m]) for m in METRICS) + f" | {n}/3 |")
    lines += ["", f"Ours leads on TTFT p95 with p < 0.025 at {wins} of {len(results)} points.", ""]
    if seeds >= 2 * BLOCK:
        lines += [f"The same run cut into {seeds // BLOCK} blocks of {BLOCK} seeds, each judged as a {BLOCK}-seed "
                  "grid run is (against that block's best peer; `python -m experiment.grid_blocks`): how often "
                  "a grid of that size would show the lead.", "", *block_table(results, ours, BLOCK), ""]
    lines += [
              "Prefix hit rate and imbalance, median over seeds:", "",
              "| point | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for name, res in results.items():
        lines.append(f"| {name} | " + " | ".join(
            f"{median_over_seeds([m.prefix_hit_rate for m in res[a]]):.3f} / "
            f"{median_over_seeds([m.imbalance for m in res[a]]):.2f}"
            if a in res else "–" for a in arms) + " |")
    lines += ["", "Points:", ""] + [f"- `{p.point.name}`: {p.description}" for p in POINTS if p.point.name in results]
    lines += ["", "Peer arms (our code from each published formula, `experiment/peers.py`):", "", *PEER_SOURCES, "",
              f"What every arm sees in the simulator: {CREDIT_SEEN[credit]}; its own in-flight counts; "
              "uncached prompt tokens it routed, retired at "
              "the first token (`prefill_tokens`) or at the end (`uncached_tokens`); the decode batch (own "
              "requests past their first token); distinct KV blocks of its requests in flight (Dynamo's "
              "active blocks; output blocks not counted, at most 4 per request here); distinct prompt blocks "
              "ever routed to an engine (the size of SGLang's approximate tree, never evicted); the engines' "
              "waiting queue (read by `llmd-blend` and `lane`) and, for `llmd-blend`, KV usage, as a zero-lag "
              "scrape would show them (a favour: the sidecar scrapes every second)."]
    lines += ["", f"Command: `{command}` ({wall_s / 60:.1f} min wall, {jobs} worker processes).", "", GRID_END]
    return "\n".join(lines)


def write_doc(doc: Path, section: str) -> None:
    """Replace the grid section of `doc` (or insert it before the hand-written findings, else at the end)."""
    replace_section(doc, GRID_START, GRID_END, section, "## Hand-written findings")


def write_per_seed(path: Path, results: Mapping[str, Mapping[str, Sequence[SeedMetrics]]]) -> None:
    rows = [{"point": p, **m.row()} for p, res in results.items() for ms in res.values() for m in ms]
    if rows:
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiment.grid", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=101,
                    help="seeds first..first+N-1; the report says whether they are held out from the design "
                    "(1-10) and tuning (201-220) seeds")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--ours", default="lane-spread", help="the arm judged against the peers")
    ap.add_argument("--points", default="all", help="comma list of point names, or 'all'")
    ap.add_argument("--arms", default="", help="extra arms beyond ours, the peers and the baselines")
    ap.add_argument("--credit", choices=tuple(CREDIT_SEEN), default="multi",
                    help="prefix credit for every arm: LMCache stores (multi) or GPU caches via KV events (gpu)")
    ap.add_argument("--requests", type=int, default=DEFAULT_REQUESTS,
                    help="measured requests per seed and point (longer windows: steadier per-seed tails)")
    ap.add_argument("--out", type=Path, default=Path("out/experiment/grid"))
    ap.add_argument("--doc", type=Path, default=None, help="docs/results.md to update")
    ap.add_argument("--cache", type=Path, default=Path("out/experiment/grid-workloads"),
                    help="prepared workloads kept between runs")
    ap.add_argument("--prepare-only", action="store_true", help="build the workloads into --cache and stop")
    args = ap.parse_args(argv)
    points = POINTS if args.points == "all" else tuple(POINTS_BY_NAME[n.strip()] for n in args.points.split(","))
    if args.requests < 1:
        ap.error("--requests must be >= 1")
    points = tuple(with_requests(with_credit(gp, args.credit), args.requests) for gp in points)
    names = [args.ours, *BASELINES, *PEERS] + [a.strip() for a in args.arms.split(",") if a.strip()]
    arms = [arm_by_name(n) for n in dict.fromkeys(names)]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = run_grid(points, [] if args.prepare_only else arms, seeds, args.jobs, args.cache)
    wall = time.perf_counter() - t0
    if args.prepare_only:
        print(f"prepared {len(points) * len(seeds)} workloads in {wall:.0f} s")
        return 0
    command = invoked_as("python -m experiment.grid") + " " + " ".join(
        argv if argv is not None else sys.argv[1:])
    section = report(results, args.ours, [a.name for a in arms], len(seeds), command.strip(), wall, args.jobs,
                     args.first_seed, args.credit, args.requests)
    write_per_seed(args.out / "per_seed.csv", results)
    (args.out / "report.md").write_text(section + "\n")
    if args.doc is not None:
        write_doc(args.doc, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
