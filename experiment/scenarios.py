"""Fleets and workloads drawn at random: the default judged on operating points nobody chose (DES).

    python -m experiment.scenarios [--role held-out|design] [--draws 24] [--seeds 3] [--jobs 2]
        [--arms a,b] [--no-peers] [--out out/experiment/scenarios] [--doc docs/results.md] [--smoke]

A draw is one operating point, drawn from the space below by its own random stream (`draw(role, index)`): the
same role and index always give the same point. Two roles never share a stream, nor the workload seeds they
are run on:

- `design`: the draws the default was designed and its one parameter chosen on (draw streams 1-999, workload
  seeds 1-9);
- `held-out`: the draws the report is made on, never looked at while designing (draw streams 1001-1999,
  workload seeds 101-109).

The space (each draw independently):

- engines: 2-16, log-uniform; speeds equal (half the draws) or each engine slowed by a factor uniform in 1-3
  (prefill, loads and every step at 1/factor of the calibrated engine's speed: a mix up to 3x);
- arrivals: Poisson, bursty (a two-state MMPP at 3x the mean rate for 20% of the time, ~2 s bursts, or gamma
  gaps of CV 3) or a ramp (the rate rising from 0.5x to 1.5x of the mean across the run);
- load: 0.3-1.3 of the fleet's estimated capacity (`capacity`: an engine's request time from the service model
  at the hit rate the fleet's caches allow, summed over engines at their speeds);
- sharing: 1-512 prefixes (log-uniform), Zipf exponent 0-1.4, prefix 100-12,000 tokens and unique suffix
  20-3,000 tokens (log-uniform each; prefix and suffix scaled down so that a prompt's text stays under 16k
  tokens, the replies a multi-turn history carries aside): from one hot document to nothing shared;
- outputs: short (16-128 tokens) in 2 of 3 draws, long (256-1,024) otherwise;
- multi-turn chat sessions in 1 draw of 4 (2-8 turns, each resending the history).

Every draw runs in the configurations of `CONFIGS` (the shipped ones: stock LMCache BUFFERED and picker, the
multi-holder LMCache lookup, KV events BUFFERED and picker, the approximate source with a tokenizer and without,
and an exact source without a tokenizer), cold and warm, every arm through the sidecar's own pipeline
(experiment.product_router) on the same paired seeds. Per draw and configuration the figure is the ratio of
medians over the seeds of TTFT p95: ours (`--policy auto` as the sidecar resolves it) over the seed's
`loadaware` (beta 1), and over the best peer arm. The targets (issue 40) are checked in `summary`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from experiment.arms import Arm, arm_by_name
from experiment.calibration import CALIBRATED
from experiment.config_grid import CONFIGS_BY_NAME, Configuration, _task, arm_of, write_per_seed
from experiment.des import FleetConfig
from experiment.des_run import Point
from experiment.grid import GridPoint
from experiment.grid_blocks import PEERS, best_peer, median_over_seeds
from experiment.metrics import SeedMetrics
from experiment.report import invoked_as, replace_section
from experiment.workload import WorkloadSpec
from loadaware.policies.auto import AUTO
from sim.service_model import ServiceModel

START, END = "<!-- scenarios:start -->", "<!-- scenarios:end -->"
ROLES = {"design": (1, 1), "held-out": (1001, 101)}  # role -> (first draw stream, first workload seed)
FLOOR, FLOOR_WORST, FLOOR_SHARE = 1.05, 1.10, 0.97  # ours / loadaware: within 5% in 97% of draws, never past 10%
LEAD_GEOMEAN, LEAD_WORST, ELSE_GEOMEAN = 0.90, 1.25, 1.00  # ours / best peer
MAX_PROMPT = 16_000
TOKENS_PER_SEED = 1_500_000  # prompt tokens of measured requests per warm seed (bounds a draw's cost)
WARM_MAX, COLD_MAX, MIN_REQUESTS = 1200, 400, 200
SMOKE_REQUESTS = 60

# The shipped configurations, cold and warm (experiment.config_grid.Configuration names).
CONFIGS: tuple[Configuration, ...] = tuple(
    replace(CONFIGS_BY_NAME[f"{base}/{state}"]) for base in (
        "lmcache/buffered/tok", "lmcache/seen/tok", "lmcache-multi/buffered/tok", "kv-events/buffered/tok",
        "kv-events/seen/tok", "approx/buffered/tok", "approx/seen/notok", "none/buffered/notok")
    for state in ("warm", "cold"))


def knows_more(config: Configuration) -> bool:
    """Where the router knows more than a load-only peer: a tokenizer with KV events, multi-holder LMCache or the
    approximate source, warm (the issue's `lead` class; every other configuration is `else`)."""
    return config.tokenizer and config.warm and config.source in ("kv-events", "lmcache-multi", "approx")


# ---- the space ----------------------------------------------------------------------------------------
def slowed(svc: ServiceModel, factor: float) -> ServiceModel:
    """The same engine `factor` times slower: prefill and loads at 1/factor the rate, every step factor x as long."""
    return replace(svc, prefill_tokens_per_s=svc.prefill_tokens_per_s / factor,
                   lmcache_load_tokens_per_s=svc.lmcache_load_tokens_per_s / factor,
                   decode_base_ms=svc.decode_base_ms * factor, decode_per_seq_ms=svc.decode_per_seq_ms * factor,
                   prefill_overhead_ms=svc.prefill_overhead_ms * factor)


def capacity(spec: WorkloadSpec, services: Sequence[ServiceModel]) -> float:
    """The fleet's estimated sustainable rate (requests/s): per engine, 1 / (the request's prefill at the hit rate
    the fleet's GPU caches allow if the prefixes were partitioned over them + its decode steps' share of a full
    batch), summed over the engines. An estimate to scale load by, not a measurement: it ignores queueing,
    imbalance and the first-token steps (for the reference fleet it gives 14.6 req/s where the best arms sustain
    16.2-16.8, experiment.grid's "overload")."""
    history = (spec.turns - 1) / 2 * (spec.suffix_tokens + spec.max_tokens) if spec.turns > 1 else 0.0
    prompt = spec.shared_tokens + spec.suffix_tokens + history
    cacheable = spec.shared_tokens + history
    fleet_kv = sum(s.kv_capacity_tokens for s in services)
    fits = min(1.0, fleet_kv / max(1.0, spec.n_prefixes * spec.shared_tokens))
    uncached = prompt - cacheable * fits
    rate = 0.0
    for s in services:
        batch = s.max_num_seqs
        engine_s = s.prefill_seconds(int(uncached)) + spec.max_tokens * s.decode_step_seconds(batch) / batch
        rate += 1.0 / engine_s
    return rate


@dataclass(frozen=True)
class Draw:
    name: str  # d001 (design), h001 (held-out)
    role: str
    load: float  # offered rate over the estimated capacity
    point: GridPoint
    warm_requests: int
    cold_requests: int


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def draw(role: str, index: int) -> Draw:
    """The `index`-th draw (1-based) of `role`, from its own random stream."""
    first, _ = ROLES[role]
    rng = np.random.default_rng([4040, first + index - 1])
    engines = round(_log_uniform(rng, 2, 16))
    mixed = bool(rng.random() < 0.5)
    factors = [float(rng.uniform(1.0, 3.0)) for _ in range(engines)] if mixed else [1.0] * engines
    services = tuple(slowed(CALIBRATED, f) if f != 1.0 else CALIBRATED for f in factors)
    arrival = str(rng.choice(["poisson", "mmpp", "gamma", "ramp"], p=[0.4, 0.2, 0.15, 0.25]))
    n_prefixes = round(_log_uniform(rng, 1, 512))
    zipf_s = float(rng.uniform(0.0, 1.4))
    prefix = round(_log_uniform(rng, 100, 12_000))
    suffix = round(_log_uniform(rng, 20, 3_000))
    long_out = bool(rng.random() < 1 / 3)
    max_tokens = round(_log_uniform(rng, 256, 1024) if long_out else _log_uniform(rng, 16, 128))
    turns = int(rng.integers(2, 9)) if rng.random() < 0.25 else 1
    load = float(rng.uniform(0.3, 1.3))
    if prefix + suffix + (turns - 1) * (suffix + max_tokens) > MAX_PROMPT:
        scale = MAX_PROMPT / (prefix + suffix + (turns - 1) * (suffix + max_tokens))
        prefix, suffix = max(100, int(prefix * scale)), max(20, int(suffix * scale))
    chat = turns > 1
    spec = WorkloadSpec(n_prefixes=n_prefixes, zipf_s=zipf_s, prefix_tokens=max(prefix, 64 if chat else 16),
                        suffix_tokens=max(suffix, 40 if chat else 1), max_tokens=max_tokens, arrival=arrival,  # type: ignore[arg-type]
                        turns=turns, warmup_passes=2 if n_prefixes <= 256 else 1, rate=1.0)
    spec = replace(spec, rate=load * capacity(spec, services))
    prompt = spec.shared_tokens + spec.suffix_tokens + (turns - 1) / 2 * (spec.suffix_tokens + max_tokens)
    warm = int(min(WARM_MAX, max(MIN_REQUESTS, TOKENS_PER_SEED / prompt)))
    cold = int(min(COLD_MAX, max(MIN_REQUESTS, TOKENS_PER_SEED / 3 / prompt)))
    name = f"{role[0]}{index:03d}"
    speeds = "equal" if not mixed else "x" + "/".join(f"{1 / f:.2f}" for f in factors)
    description = (f"{engines} engines ({speeds}), {arrival} at {load:.2f} of capacity ({spec.rate:.2f} req/s), "
                   f"{n_prefixes} prefixes Zipf {zipf_s:.2f}, prefix {spec.prefix_tokens} + suffix "
                   f"{spec.suffix_tokens} tokens, {max_tokens} out" + (f", {turns} turns" if turns > 1 else ""))
    fleet = FleetConfig(engines=engines, service=CALIBRATED, engine_services=services)
    return Draw(name, role, load, GridPoint(Point(name, spec, fleet), description), warm, cold)


def draws(role: str, count: int) -> tuple[Draw, ...]:
    return tuple(draw(role, i) for i in range(1, count + 1))


def seeds_of(role: str, count: int) -> list[int]:
    return list(range(ROLES[role][1], ROLES[role][1] + count))


# ---- running ------------------------------------------------------------------------------------------
Results = dict[str, dict[str, dict[str, list[SeedMetrics]]]]  # config -> draw -> arm -> by seed


def applied(config: Configuration, d: Draw, smoke: bool = False) -> GridPoint:
    n = SMOKE_REQUESTS if smoke else d.warm_requests if config.warm else d.cold_requests
    return replace(config, requests=n).applied(d.point)


def run(configs: Sequence[Configuration], ds: Sequence[Draw], arms: Sequence[Arm], seeds: Sequence[int], jobs: int,
        cache: Path | None, smoke: bool = False) -> Results:
    tasks = [(c, d, s) for d in ds for c in configs for s in seeds]
    jobs_in = [(applied(c, d, smoke), tuple(arms), s, cache) for c, d, s in tasks]
    done: list[list[SeedMetrics]] = []
    t0 = time.perf_counter()

    def progress() -> None:
        if len(done) % max(1, len(jobs_in) // 20) == 0 or len(done) == len(jobs_in):
            print(f"  {len(done)}/{len(jobs_in)} runs, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for row in pool.map(_task, jobs_in, chunksize=1):
                done.append(row)
                progress()
    else:
        for j in jobs_in:
            done.append(_task(j))
            progress()
    out: Results = {}
    for (c, d, _), row in zip(tasks, done):
        cell = out.setdefault(c.name, {}).setdefault(d.name, {a.name: [] for a in arms})
        for arm, m in zip(arms, row):
            cell[arm.name].append(m)
    return out


# ---- analysis -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ratio:
    config: str
    draw: str
    ours: float  # median over seeds of TTFT p95
    vs_loadaware: float  # ours / loadaware, medians over seeds
    vs_peer: float  # ours / the best peer (nan without peers)
    peer: str


def arms_of(results: Results) -> list[str]:
    """Every arm of a run, in its order."""
    return list(dict.fromkeys(a for by in results.values() for res in by.values() for a in res))


def ratios(results: Results, ours: str, peers: Sequence[str] = PEERS) -> list[Ratio]:
    out = []
    for config, by_draw in results.items():
        arm = arm_of(ours, config)
        for name, res in by_draw.items():
            med = {a: median_over_seeds([m.ttft_p95 for m in ms]) for a, ms in res.items()}
            peer = best_peer(res, "ttft_p95", peers) if any(p in res for p in peers) else ""
            out.append(Ratio(config, name, med[arm], _div(med[arm], med["loadaware"]),
                             _div(med[arm], med[peer]) if peer else float("nan"), peer))
    return out


def _div(a: float, b: float) -> float:
    return a / b if b > 0 else (1.0 if a <= 0 else float("inf"))


def geomean(values: Sequence[float]) -> float:
    vals = [v for v in values if v == v and v > 0 and v != float("inf")]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")


@dataclass(frozen=True)
class Verdict:
    floor_within: int  # cells within FLOOR of loadaware
    cells: int
    floor_worst: Ratio
    lead_geomean: float
    lead_worst: Ratio | None
    else_geomean: float

    @property
    def floor_met(self) -> bool:
        return self.floor_worst.vs_loadaware <= FLOOR_WORST and self.floor_within >= FLOOR_SHARE * self.cells

    @property
    def lead_met(self) -> bool:
        worst = self.lead_worst.vs_peer if self.lead_worst is not None else 0.0
        return self.lead_geomean <= LEAD_GEOMEAN and worst <= LEAD_WORST

    @property
    def else_met(self) -> bool:
        return not self.else_geomean > ELSE_GEOMEAN


def verdict(rs: Sequence[Ratio]) -> Verdict:
    lead = [r for r in rs if knows_more(CONFIGS_BY_NAME[r.config])]
    rest = [r for r in rs if not knows_more(CONFIGS_BY_NAME[r.config])]
    worst_lead = max(lead, key=lambda r: r.vs_peer) if lead and all(r.vs_peer == r.vs_peer for r in lead) else None
    return Verdict(sum(r.vs_loadaware <= FLOOR for r in rs), len(rs), max(rs, key=lambda r: r.vs_loadaware),
                   geomean([r.vs_peer for r in lead]), worst_lead, geomean([r.vs_peer for r in rest]))


def report(results: Results, ds: Sequence[Draw], ours: str, seeds: Sequence[int], command: str, wall_s: float,
           jobs: int, picture: str | None) -> str:
    rs = ratios(results, ours)
    v = verdict(rs)
    peers = any(r.peer for r in rs)

    def mark(ok: bool) -> str:
        return "met" if ok else "**missed**"

    role = ds[0].role if ds else "?"
    lines = [START, f"## Fleets and workloads drawn at random (`experiment.scenarios`, {role} draws)", "",
             f"{len(ds)} {role} draws ({ds[0].name}-{ds[-1].name}) x {len(results)} configurations, "
             f"{len(seeds)} paired seeds ({seeds[0]}-{seeds[-1]}), every arm through the sidecar's own pipeline; "
             "per draw and configuration, the ratio of medians over the seeds of TTFT p95. Ours is "
             + ("`--policy auto` as the sidecar resolves it in each configuration." if ours == AUTO else f"`{ours}`.")
             + " The seed's `loadaware` (beta 1) and the peers run on the same prefix sources.", "",
             f"- Floor: within {FLOOR - 1:.0%} of `loadaware` in **{v.floor_within} of {v.cells}** "
             f"({v.floor_within / max(1, v.cells):.1%}; target {FLOOR_SHARE:.0%}); worst "
             f"**{v.floor_worst.vs_loadaware:.3f}x** "
             f"({v.floor_worst.draw}, {v.floor_worst.config}; target at most {FLOOR_WORST:.2f}x): "
             f"{mark(v.floor_met)}."]
    if peers:
        worst = f"{v.lead_worst.vs_peer:.2f}x ({v.lead_worst.draw}, {v.lead_worst.config})" \
            if v.lead_worst is not None else "–"
        lines += [f"- Where the router knows more (a tokenizer with KV events, multi-holder LMCache or the approximate "
                  f"source, warm): geometric mean of ours / best peer **{v.lead_geomean:.3f}** (target at most "
                  f"{LEAD_GEOMEAN:.2f}), worst {worst} (target at most {LEAD_WORST:.2f}x): "
                  f"{mark(v.lead_met)}.",
                  f"- Everywhere else: geometric mean of ours / best peer **{v.else_geomean:.3f}** (target at most "
                  f"{ELSE_GEOMEAN:.2f}): {mark(v.else_met)}."]
    lines.append("")
    if picture:
        lines += [f"![ours over loadaware and over the best peer per draw, by configuration]({picture})", ""]
    lines += ["Per configuration (ratios of TTFT p95 medians; a row's worst names its draw):", "",
              "| configuration | within 5% of loadaware | worst vs loadaware | geomean vs loadaware | "
              "geomean vs best peer | worst vs best peer |", "|---|---|---|---|---|---|"]
    for config in dict.fromkeys(r.config for r in rs):
        row = [r for r in rs if r.config == config]
        wl = max(row, key=lambda r: r.vs_loadaware)
        wp = max(row, key=lambda r: r.vs_peer) if peers else None
        lines.append(f"| {config} | {sum(r.vs_loadaware <= FLOOR for r in row)}/{len(row)} | "
                     f"{wl.vs_loadaware:.3f} ({wl.draw}) | {geomean([r.vs_loadaware for r in row]):.3f} | "
                     + (f"{geomean([r.vs_peer for r in row]):.3f} | {wp.vs_peer:.2f} ({wp.draw}, {wp.peer}) |"
                        if wp is not None else "– | – |"))
    lines += ["", "Every arm judged as ours is (vs the best peer: the peers other than itself):", "",
              "| arm | within 5% of loadaware | worst vs loadaware | geomean vs loadaware | lead class: geomean vs "
              "best peer (worst) | else: geomean vs best peer |", "|---|---|---|---|---|---|"]
    for arm in arms_of(results):
        av = verdict(ratios(results, arm, [p for p in PEERS if p != arm]))
        arm_rs = ratios(results, arm)
        worst = f"{av.lead_worst.vs_peer:.2f}x" if av.lead_worst is not None else "–"
        lines.append(f"| `{arm}` | {av.floor_within}/{av.cells} | {av.floor_worst.vs_loadaware:.3f}x "
                     f"({av.floor_worst.draw}, {av.floor_worst.config}) | "
                     f"{geomean([r.vs_loadaware for r in arm_rs]):.3f} | {av.lead_geomean:.3f} ({worst}) | "
                     f"{av.else_geomean:.3f} |")
    misses = sorted((r for r in rs if r.vs_loadaware > FLOOR), key=lambda r: -r.vs_loadaware)
    lines += ["", f"Every cell more than {FLOOR - 1:.0%} worse than `loadaware`: "
              + ("none." if not misses else "; ".join(f"{r.draw} {r.config} {r.vs_loadaware:.3f}x "
                                                      f"({r.ours:.3f} s)" for r in misses)), "",
              "The draws:", "", "| draw | load | operating point |", "|---|---|---|"]
    lines += [f"| {d.name} | {d.load:.2f} | {d.point.description} |" for d in ds]
    lines += ["", f"Command: `{command}` ({wall_s / 60:.1f} min wall, {jobs} worker processes).", "", END]
    return "\n".join(lines)


def draw_picture(results: Results, ours: str, path: Path) -> None:
    """Per configuration, every draw's ratio (log scale) to loadaware of each arm that is neither loadaware nor a
    peer (ours among them, if it is not loadaware), and of ours to the best peer; the targets drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    own = ratios(results, ours)
    configs = list(dict.fromkeys(r.config for r in own))
    mine = [a for a in arms_of(results) if a != "loadaware" and a not in PEERS]
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.45 * len(configs) + 2), sharey=True)
    panels = [(axes[0], [(a, ratios(results, a), "vs_loadaware") for a in mine], "arm / loadaware", FLOOR),
              (axes[1], [(ours, own, "vs_peer")], "ours / best peer", 1.0)]
    for ax, series, title, line in panels:
        for k, (arm, rs, field) in enumerate(series):
            offset = (k - (len(series) - 1) / 2) * 0.8 / max(1, len(series))
            for i, config in enumerate(configs):
                vals = [getattr(r, field) for r in rs if r.config == config]
                vals = [v for v in vals if v == v and 0 < v < float("inf")]
                ys = [i + offset] * len(vals)
                ax.scatter(vals, ys, s=10, alpha=0.6, color=f"C{k}", label=arm if i == 0 else None)
                if vals:
                    ax.plot([geomean(vals)] * 2, [i + offset - 0.12, i + offset + 0.12], color="black", lw=1.5)
        ax.axvline(line, color="red", lw=0.8, ls="--")
        ax.axvline(1.0, color="grey", lw=0.5)
        ax.set_xscale("log")
        ax.set_title(title + " (TTFT p95; black: geometric mean)", fontsize=10)
        ax.set_yticks(range(len(configs)), configs, fontsize=8)
        if len(series) > 1:
            ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_doc(doc: Path, section: str) -> None:
    """Replace the scenarios' section of `doc` (or put it before the configuration grid's)."""
    replace_section(doc, START, END, section, "<!-- config-grid:start -->")


def summary(results: Results, ours: str) -> str:
    """A line per cell and the verdict, for design runs."""
    rs = ratios(results, ours)
    lines = [f"{r.config:30s} {r.draw} ours={r.ours:.3f} /loadaware={r.vs_loadaware:.3f} /peer={r.vs_peer:.3f}"
             for r in rs]
    v = verdict(rs)
    lines.append(f"floor {v.floor_within}/{v.cells} worst {v.floor_worst.vs_loadaware:.3f} ({v.floor_worst.draw} "
                 f"{v.floor_worst.config}); lead geomean {v.lead_geomean:.3f}; else geomean {v.else_geomean:.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiment.scenarios", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=tuple(ROLES), default="held-out")
    ap.add_argument("--draws", type=int, default=24)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--ours", default=AUTO)
    ap.add_argument("--arms", default="", help="extra arms beyond ours, loadaware and the peers")
    ap.add_argument("--configs", default="all", help="comma list of configuration names, or 'all'")
    ap.add_argument("--no-peers", action="store_true", help="ours, loadaware and --arms only (design runs)")
    ap.add_argument("--smoke", action="store_true", help="2 draws, 1 seed, 60 requests: the test suite's run")
    ap.add_argument("--list", action="store_true", help="print the draws and exit")
    ap.add_argument("--out", type=Path, default=Path("out/experiment/scenarios"))
    ap.add_argument("--doc", type=Path, default=None)
    ap.add_argument("--cache", type=Path, default=Path("out/experiment/scenario-workloads"))
    ap.add_argument("--from-csv", type=Path, default=None,
                    help="report on an earlier run's per_seed.csv (its draws and seeds) instead of running")
    ap.add_argument("--command", default="", help="with --from-csv: the command that made the run")
    ap.add_argument("--wall-min", type=float, default=0.0, help="with --from-csv: the run's wall time")
    args = ap.parse_args(argv)
    if args.from_csv is not None:
        return _from_csv(args)
    count, n_seeds = (2, 1) if args.smoke else (args.draws, args.seeds)
    ds = draws(args.role, count)
    if args.list:
        for d in ds:
            print(f"{d.name} load {d.load:.2f} warm {d.warm_requests} cold {d.cold_requests}: {d.point.description}")
        return 0
    configs = CONFIGS if args.configs == "all" else tuple(CONFIGS_BY_NAME[n.strip()] for n in args.configs.split(","))
    seeds = seeds_of(args.role, n_seeds)
    ours = [args.ours] if args.ours != AUTO else sorted({arm_of(AUTO, c.name) for c in configs})
    names = [*ours, "loadaware", *(() if args.no_peers else PEERS),
             *(a.strip() for a in args.arms.split(",") if a.strip())]
    arms = [arm_by_name(n) for n in dict.fromkeys(names)]
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = run(configs, ds, arms, seeds, args.jobs, args.cache, args.smoke)
    wall = time.perf_counter() - t0
    write_per_seed(args.out / "per_seed.csv", results)
    if args.no_peers:
        print(summary(results, args.ours))
        return 0
    picture = args.doc.parent / "scenarios.png" if args.doc is not None else args.out / "scenarios.png"
    draw_picture(results, args.ours, picture)
    command = invoked_as("python -m experiment.scenarios") + " " + " ".join(
        argv if argv is not None else sys.argv[1:])
    section = report(results, ds, args.ours, seeds, command.strip(), wall, args.jobs, picture.name)
    (args.out / "report.md").write_text(section + "\n")
    if args.doc is not None:
        write_doc(args.doc, section)
    print(section)
    return 0


def _from_csv(args: argparse.Namespace) -> int:
    """The report, picture and doc section of an earlier run, from its per_seed.csv."""
    from experiment.config_grid import read_per_seed

    results = read_per_seed([args.from_csv])
    names = sorted({name for by in results.values() for name in by})
    role = next(r for r in ROLES if r[0] == names[0][0])
    ds = tuple(d for d in draws(role, max(int(n[1:]) for n in names)) if d.name in names)
    seeds = sorted({m.seed for by in results.values() for res in by.values() for ms in res.values() for m in ms})
    picture = args.doc.parent / "scenarios.png" if args.doc is not None else args.out / "scenarios.png"
    args.out.mkdir(parents=True, exist_ok=True)
    draw_picture(results, args.ours, picture)
    section = report(results, ds, args.ours, seeds, args.command or f"from {args.from_csv}", args.wall_min * 60,
                     args.jobs, picture.name)
    (args.out / "report.md").write_text(section + "\n")
    if args.doc is not None:
        write_doc(args.doc, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
