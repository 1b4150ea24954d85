"""The configuration grid: every operating point x every configuration the sidecar ships (DES).

    python -m experiment.config_grid [--seeds 20] [--first-seed 101] [--jobs 2] [--ours lane-spread]
        [--configs all|NAME,...] [--points all|a,b] [--arms a,b] [--out out/experiment/config-grid]
        [--doc docs/results.md] [--smoke]

A configuration is what the sidecar is deployed with, and so what it can see (experiment.des.FleetConfig):

- prefix source: `lmcache` (stock LMCache 0.5.6: each 256-token chunk credited to its first registered holder,
  the walk stopping at a gap; with the sidecar's own record of where it sent each prefix beside it, as the
  sidecar's default with `--lmcache-url` and a tokenizer combines them, loadaware/prefix/combined.py),
  `lmcache-multi` (a multi-holder lookup, as the reference ran: every CPU-store holder, evicted GPU prefixes
  included), `kv-events` (every engine's GPU blocks, exactly), `approx` (the
  sidecar's own approximate index of what it routed, the product's code);
- response path: `seen` (the InferencePool picker's full duplex: first response chunks pass the sidecar) or
  `buffered` (the shipped BUFFERED Envoy: no response body, the prefill retired by the sidecar's estimate);
- tokenizer: on, or off (the exact sources then see no tokens at all, so they are one configuration,
  `none`; the approximate source counts text units);
- warm (2,000 measured requests after the two warm-up passes) or cold (500 requests, no warm-up).

Every arm decides through the sidecar's own pipeline (experiment.product_router); the engines scrape every
second, as the sidecar's default `--scrape-interval-s` does. Per cell: ours against the best peer arm and
against the seed's `loadaware` (beta 1) on TTFT p95, one-sided exact Wilcoxon over the paired seeds,
bootstrap 95% CI of the median paired change. Writes per_seed.csv, report.md and heatmap.png to --out and,
with --doc, the report between the config-grid markers of docs/results.md.
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

from experiment.arms import Arm, arm_by_name
from experiment.des import Credit, simulate
from experiment.grid import POINTS, POINTS_BY_NAME, GridPoint, prepared
from experiment.grid_blocks import PEERS, best_peer, median_over_seeds
from experiment.metrics import DEFAULT_SLO_S, SeedMetrics, seed_metrics
from experiment.report import invoked_as, replace_section
from experiment.stats import PairedComparison, paired_comparison
from loadaware.policies.auto import AUTO, auto_policy

START, END = "<!-- config-grid:start -->", "<!-- config-grid:end -->"
SCRAPE_INTERVAL_S = 1.0  # the sidecar's default --scrape-interval-s
FLOOR = 0.05  # ours may be at most this much worse than the seed's loadaware in any cell
WARM_REQUESTS, COLD_REQUESTS, SMOKE_REQUESTS = 2000, 500, 60


@dataclass(frozen=True)
class Configuration:
    source: str  # lmcache | lmcache-multi | kv-events | approx | none
    response_seen: bool
    tokenizer: bool
    warm: bool
    requests: int = 0  # measured requests per seed; 0: 2,000 warm, 500 cold

    @property
    def name(self) -> str:
        return (f"{self.source}/{'seen' if self.response_seen else 'buffered'}/"
                f"{'tok' if self.tokenizer else 'notok'}/{'warm' if self.warm else 'cold'}")

    @property
    def credit(self) -> Credit:
        credit: dict[str, Credit] = {"lmcache": "single", "lmcache-multi": "multi", "kv-events": "gpu",
                                     "approx": "approx", "none": "gpu"}
        return credit[self.source]

    def applied(self, gp: GridPoint) -> GridPoint:
        p = gp.point
        fleet = replace(p.fleet, credit=self.credit, response_seen=self.response_seen, tokenizer=self.tokenizer,
                        router_scrape_interval_s=SCRAPE_INTERVAL_S, approx_beside=self.source == "lmcache")
        spec = replace(p.spec, n_requests=self.requests or (WARM_REQUESTS if self.warm else COLD_REQUESTS),
                       warmup_passes=p.spec.warmup_passes if self.warm else 0)
        return replace(gp, point=replace(p, fleet=fleet, spec=spec))


def configurations() -> tuple[Configuration, ...]:
    """Every configuration the sidecar ships: 4 sources with a tokenizer, 2 without (the approximate source on
    text units; an exact source, which then sees nothing), each behind both response paths, cold and warm."""
    out = []
    with_tokenizer = ("lmcache", "lmcache-multi", "kv-events", "approx")
    for tokenizer, sources in ((True, with_tokenizer), (False, ("approx", "none"))):
        for source in sources:
            for seen in (True, False):
                for warm in (True, False):
                    out.append(Configuration(source, seen, tokenizer, warm))
    return tuple(out)


CONFIGS_BY_NAME = {c.name: c for c in configurations()}
Results = dict[str, dict[str, dict[str, list[SeedMetrics]]]]  # config -> point -> arm -> by seed


def _task(job: tuple[GridPoint, tuple[Arm, ...], int, Path | None]) -> list[SeedMetrics]:
    gp, arms, seed, cache = job
    work = prepared(gp.point, seed, cache)
    return [seed_metrics(simulate(work, arm, gp.point.fleet, seed), DEFAULT_SLO_S) for arm in arms]


def run(configs: Sequence[Configuration], points: Sequence[GridPoint], arms: Sequence[Arm], seeds: Sequence[int],
        jobs: int, cache: Path | None) -> Results:
    tasks = [(c, c.applied(gp), s) for c in configs for gp in points for s in seeds]
    jobs_in = [(gp, tuple(arms), s, cache) for _, gp, s in tasks]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            done = list(pool.map(_task, jobs_in, chunksize=1))
    else:
        done = [_task(j) for j in jobs_in]
    out: Results = {}
    for (c, gp, _), row in zip(tasks, done):
        cell = out.setdefault(c.name, {}).setdefault(gp.point.name, {a.name: [] for a in arms})
        for arm, m in zip(arms, row):
            cell[arm.name].append(m)
    return out


@dataclass(frozen=True)
class Cell:
    config: str
    point: str
    ours: float  # median TTFT p95 over seeds
    peer: str
    vs_peer: PairedComparison
    vs_loadaware: PairedComparison | None

    @property
    def ratio(self) -> float:
        """Ours over the best peer, medians over seeds."""
        base = self.vs_peer.base_median
        return self.ours / base if base > 0 else float("nan")

    @property
    def leads(self) -> bool:
        return self.vs_peer.significant()

    @property
    def floor_held(self) -> bool:
        c = self.vs_loadaware
        return c is None or c.effect.median <= FLOOR


def arm_of(ours: str, config: str) -> str:
    """The arm judged in a configuration: `ours`, or for "auto" what `--policy auto` runs there (the sidecar's
    own rule, loadaware/policies/auto.py)."""
    if ours != AUTO:
        return ours
    c = CONFIGS_BY_NAME.get(config)
    return auto_policy(c.tokenizer if c is not None else "/tok/" in config)[0]


def cells(results: Results, ours: str, baseline: str = "loadaware") -> list[Cell]:
    out = []
    for config, by_point in results.items():
        arm = arm_of(ours, config)
        for point, res in by_point.items():
            peer = best_peer(res, "ttft_p95")
            ours_v = [m.ttft_p95 for m in res[arm]]
            vs_peer = paired_comparison("ttft_p95", arm, peer, ours_v, [m.ttft_p95 for m in res[peer]])
            vs_base = paired_comparison("ttft_p95", arm, baseline, ours_v, [m.ttft_p95 for m in res[baseline]]) \
                if baseline in res and baseline != arm else None
            out.append(Cell(config, point, median_over_seeds(ours_v), peer, vs_peer, vs_base))
    return out


def _pct(c: PairedComparison) -> str:
    mark = "**" if c.significant() else ""
    return f"{mark}{c.effect.median * 100:+.1f}%{mark} (p {c.test.pvalue:.3g})"


def report(results: Results, ours: str, seeds: Sequence[int], command: str, wall_s: float, jobs: int,
           heatmap: str | None) -> str:
    cs = cells(results, ours)
    leads = sum(c.leads for c in cs)
    floor = sum(c.floor_held for c in cs)
    lines = [START, "## The configuration grid (discrete-event mode, `experiment.config_grid`)", "",
             (f"The default (`--policy auto`: `{auto_policy(True)[0]}` in the configurations with a tokenizer, "
              f"`{auto_policy(False)[0]}` without)" if ours == AUTO else f"`{ours}`")
             + " against the best peer arm (" + ", ".join(f"`{p}`" for p in PEERS) + ") and against the "
             f"seed's `loadaware` (beta 1) in every point x configuration cell: {len(seeds)} paired seeds "
             f"({seeds[0]}-{seeds[-1]}), TTFT p95, one-sided exact Wilcoxon (bold: p < 0.025), median paired "
             "change. Every arm decides through the sidecar's own pipeline (`experiment/product_router.py`).", "",
             f"- Leads the best peer (p < 0.025): **{leads} of {len(cs)}** cells.",
             f"- Floor (at most {FLOOR:.0%} worse than `loadaware`, median paired change): **{floor} of {len(cs)}**.",
             ""]
    if heatmap:
        lines += [f"![ratio of ours to the best peer, TTFT p95]({heatmap})", ""]
    configs = list(dict.fromkeys(c.config for c in cs))
    points = list(dict.fromkeys(c.point for c in cs))
    by = {(c.config, c.point): c for c in cs}
    lines += ["Ours / best peer (medians of TTFT p95; **bold**: a lead with p < 0.025; ⚠: more than "
              f"{FLOOR:.0%} worse than `loadaware`):", "",
              "| configuration | " + " | ".join(points) + " | leads | floor |", "|---|" + "---|" * (len(points) + 2)]
    for config in configs:
        row = [by[(config, p)] for p in points if (config, p) in by]
        cells_md = [(f"**{c.ratio:.2f}**" if c.leads else f"{c.ratio:.2f}") + ("" if c.floor_held else " ⚠")
                    for c in row]
        lines.append(f"| {config} | " + " | ".join(cells_md) + f" | {sum(c.leads for c in row)}/{len(row)} | "
                     f"{sum(c.floor_held for c in row)}/{len(row)} |")
    lines += ["", "Every cell:", ""]
    lines += ["| configuration | point | ours p95 s | vs best peer | vs loadaware |", "|---|---|---|---|---|"]
    for c in cs:
        base = _pct(c.vs_loadaware) if c.vs_loadaware is not None else "–"
        flag = "" if c.floor_held else " ⚠"
        lines.append(f"| {c.config} | {c.point} | {c.ours:.3f} | {_pct(c.vs_peer)} vs {c.peer} | {base}{flag} |")
    lines += ["", f"Command: `{command}` ({wall_s / 60:.1f} min wall, {jobs} worker processes).", "", END]
    return "\n".join(lines)


def draw_heatmap(results: Results, ours: str, path: Path) -> None:
    """One picture: log2 of ours over the best peer (TTFT p95 medians), configurations by points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cs = cells(results, ours)
    configs = list(dict.fromkeys(c.config for c in cs))
    points = list(dict.fromkeys(c.point for c in cs))
    grid = np.full((len(configs), len(points)), np.nan)
    for c in cs:
        grid[configs.index(c.config), points.index(c.point)] = c.ratio
    fig, ax = plt.subplots(figsize=(1.2 * len(points) + 3, 0.35 * len(configs) + 1.5))
    im = ax.imshow(np.log2(grid), cmap="RdYlGn_r", vmin=-2, vmax=2, aspect="auto")
    ax.set_xticks(range(len(points)), points, rotation=30, ha="right")
    ax.set_yticks(range(len(configs)), configs, fontsize=8)
    for i in range(len(configs)):
        for j in range(len(points)):
            if grid[i, j] == grid[i, j]:
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="log2(ours / best peer), TTFT p95")
    ax.set_title(f"{ours} / best peer, TTFT p95 (lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_per_seed(path: Path, results: Results) -> None:
    rows = [{"config": c, "point": p, **m.row()} for c, by_point in results.items() for p, res in by_point.items()
            for ms in res.values() for m in ms]
    if rows:
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


def read_per_seed(paths: Sequence[Path]) -> Results:
    """The results of one or more runs' per_seed.csv (e.g. two seed ranges of the same grid), seeds in order."""
    import dataclasses

    types = {f.name: f.type for f in dataclasses.fields(SeedMetrics)}
    rows: list[dict[str, str]] = []
    for path in paths:
        with path.open() as fh:
            rows += list(csv.DictReader(fh))
    rows.sort(key=lambda r: int(r["seed"]))
    out: Results = {}
    for r in rows:
        kw = {k: r[k] if t in ("str", str) else int(r[k]) if t in ("int", int) else float(r[k])
              for k, t in types.items()}
        m = SeedMetrics(**kw)  # type: ignore[arg-type]
        out.setdefault(r["config"], {}).setdefault(r["point"], {}).setdefault(m.arm, []).append(m)
    return out


def write_doc(doc: Path, section: str) -> None:
    """Replace the configuration grid's section (or put it before the single-configuration grid it supersedes)."""
    replace_section(doc, START, END, section, "<!-- grid:start -->")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiment.config_grid", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=101)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--ours", default="lane-spread")
    ap.add_argument("--configs", default="all", help="comma list of configuration names, or 'all'")
    ap.add_argument("--points", default="all", help="comma list of point names, or 'all'")
    ap.add_argument("--arms", default="", help="extra arms beyond ours, loadaware and the peers")
    ap.add_argument("--no-peers", action="store_true", help="ours, loadaware and --arms only (design runs)")
    ap.add_argument("--smoke", action="store_true",
                    help="every configuration at one point, 2 seeds, 60 requests: the test suite's run")
    ap.add_argument("--out", type=Path, default=Path("out/experiment/config-grid"))
    ap.add_argument("--doc", type=Path, default=None)
    ap.add_argument("--cache", type=Path, default=Path("out/experiment/grid-workloads"))
    ap.add_argument("--from-csv", type=Path, nargs="+", default=None,
                    help="report on earlier runs' per_seed.csv files instead of running (seed ranges merged)")
    args = ap.parse_args(argv)
    if args.from_csv:
        results = read_per_seed(args.from_csv)
        seeds = sorted({m.seed for by_point in results.values() for res in by_point.values() for ms in res.values()
                        for m in ms})
        return _write(results, args, seeds, 0.0, "python -m experiment.config_grid " + " ".join(
            argv if argv is not None else sys.argv[1:]))
    configs = configurations() if args.configs == "all" else tuple(CONFIGS_BY_NAME[n.strip()]
                                                                     for n in args.configs.split(","))
    points: Sequence[GridPoint] = POINTS if args.points == "all" else tuple(
        POINTS_BY_NAME[n.strip()] for n in args.points.split(","))
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    if args.smoke:
        points = (POINTS_BY_NAME["reference"],)
        seeds = seeds[:2]
        configs = tuple(replace(c, requests=SMOKE_REQUESTS) for c in configs)
    names = [*([args.ours] if args.ours != AUTO else auto_policy(True)[:1]), "loadaware",
             *(() if args.no_peers else PEERS)] + [
        a.strip() for a in args.arms.split(",") if a.strip()]
    arms = [arm_by_name(n) for n in dict.fromkeys(names)]
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = run(configs, points, arms, seeds, args.jobs, args.cache)
    wall = time.perf_counter() - t0
    write_per_seed(args.out / "per_seed.csv", results)
    if args.no_peers:
        print(summary(results, args.ours, peers=False))
        return 0
    command = invoked_as("python -m experiment.config_grid") + " " + " ".join(
        argv if argv is not None else sys.argv[1:])
    return _write(results, args, seeds, wall, command)


def _write(results: Results, args: argparse.Namespace, seeds: Sequence[int], wall: float, command: str) -> int:
    """The report, the heat map (beside --doc as config-grid-heatmap.png when given) and the doc section."""
    args.out.mkdir(parents=True, exist_ok=True)
    heat = args.doc.parent / "config-grid-heatmap.png" if args.doc is not None else args.out / "heatmap.png"
    draw_heatmap(results, args.ours, heat)
    section = report(results, args.ours, seeds, command.strip(), wall, args.jobs, heat.name)
    (args.out / "report.md").write_text(section + "\n")
    if args.doc is not None:
        write_doc(args.doc, section)
    print(section)
    return 0


def summary(results: Results, ours: str, peers: bool = True) -> str:
    """A line per cell, for quick looks: ours (and every arm) against loadaware, and against the best peer."""
    out = []
    for config, by_point in results.items():
        for point, res in by_point.items():
            med = {a: median_over_seeds([m.ttft_p95 for m in ms]) for a, ms in res.items()}
            arm = arm_of(ours, config)
            line = f"{config:34s} {point:14s} " + " ".join(f"{a}={v:.3f}" for a, v in med.items())
            if peers:
                peer = best_peer(res, "ttft_p95")
                line += f" | ours/peer {med[arm] / med[peer]:.2f} ({peer})"
            out.append(line + f" | ours/loadaware {med[arm] / med['loadaware']:.2f}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
