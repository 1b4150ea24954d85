"""Case `admission_replicas`: bench/admission.py's saturated fleet behind TWO sidecar replicas, each with its own
Envoy (envoy/envoy.yaml, BUFFERED), both routing to the same two simulated engines.

docs/architecture.md ("Several replicas") derives, without measuring it, that each sidecar counts only its own
requests and sees the other replica's at its next scrape, so the top band keeps its reserved slot while the
other replicas' lower-band admissions within one `--scrape-interval-s` stay below the reserve.
This measures it: per scrape interval (0.1 s and 1 s by default), the same open-loop traffic as bench/admission.py
(its mix, objectives, engines, time to live and bounds) at 0.7x and 1.5x the fleet's capacity (measured once,
through replica A), sent to A and B in turn (each carries half), and as the in-run reference the same two
rates through A alone (B idle) on the same fleet and sidecars. Printed per run: statuses, lost, critical TTFT
p50/p95, standard p95, each sidecar's admission outcomes (summed and per replica), and the other replica's
lower-band admissions per scrape interval (the derived condition's left side); per interval, the critical p95
at 1.5x over 0.7x for one replica and for two, and two over one.

    python -m bench.admission_replicas [--seed N] [--scrape-interval-s S ...] [--quick] [--no-reference]
                                       [--out DIR]

Everything runs on private ports (free loopback ports, the engines on BASE_IP), outside the loopback lock.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.envoy import EnvoyProc
from testkit.fleet import FleetProc
from testkit.paths import TINY_TOKENIZER
from testkit.ports import free_port
from testkit.sidecar import SidecarProc

from .admission import (
    ENGINES,
    FLEET_ARGS,
    MIX,
    OBJECTIVES,
    TTL_S,
    RunResult,
    Sent,
    capacity,
    get_json,
    open_loop,
    outcomes_delta,
    outcomes_of,
    sidecar_args,
)
from .admission import _s as ms
from .soak import private_envoy_config
from .stats import percentile

log = logging.getLogger("bench.admission_replicas")

BASE_IP = "127.0.79.2"  # the engines' own: not the shipped 127.0.0.2-4, nor the soaks' 127.0.77.x / 127.0.78.x
SCRAPE_INTERVALS_S = (0.1, 1.0)
LOADS = (0.7, 1.5)
REPLICAS = ("A", "B")
LOWER_BANDS = ("0", "-1")  # below the top band (critical, 10)
SENT_ON = ("admitted", "released", "placed_ttl", "placed_full")  # outcomes that send a request to an engine


@dataclass
class Replica:
    name: str
    sidecar: SidecarProc
    envoy: EnvoyProc

    @property
    def url(self) -> str:
        return self.envoy.url

    def outcomes(self) -> dict[str, float]:
        return outcomes_of(self.sidecar.metrics_listen)

    def admission_state(self) -> dict[str, Any]:
        return dict(get_json(f"{self.sidecar.debug_url}/debug/state").get("admission") or {})


@contextlib.contextmanager
def replicas(fleet: FleetProc, log_dir: Path, admission_args: list[str]) -> Iterator[list[Replica]]:
    """A sidecar and its own Envoy per replica, all on free ports, every Envoy routing to the whole fleet."""
    with contextlib.ExitStack() as stack:
        out = []
        for name in REPLICAS:
            logs = log_dir / name
            port = free_port()
            sidecar = stack.enter_context(SidecarProc(
                ["--listen", f"127.0.0.1:{port}", "--endpoints", ",".join(fleet.endpoints),
                 "--tokenizer", str(TINY_TOKENIZER), "--metrics-listen", f"127.0.0.1:{free_port()}",
                 *admission_args], log_dir=logs))
            config = private_envoy_config(fleet.endpoints, free_port(), free_port(), port, logs / "envoy-replica.yaml")
            out.append(Replica(name, sidecar, stack.enter_context(EnvoyProc(config, logs))))
        yield out


def lower_sent_on(outcomes: dict[str, float]) -> float:
    """Requests of the bands below the top one that the sidecar sent on to an engine."""
    return sum(outcomes.get(f"{band}/{o}", 0) for band in LOWER_BANDS for o in SENT_ON)


def summed(per: dict[str, dict[str, float]]) -> dict[str, float]:
    total: Counter[str] = Counter()
    for outcomes in per.values():
        total.update(outcomes)
    return dict(sorted(total.items()))


def replica_figures(sent: list[Sent], outcomes: dict[str, float], held_max: int) -> dict[str, Any]:
    critical = [s.ttft_s for s in sent if s.objective == "critical" and s.status == 200 and s.ttft_s is not None]
    return {"requests": len(sent), "status": {str(k): v for k, v in sorted(Counter(s.status for s in sent).items())},
            "critical_ttft_p95_s": percentile(critical, 95) if critical else None,
            "outcomes": outcomes, "lower_sent_on": lower_sent_on(outcomes), "held_max": held_max}


async def run_at(targets: list[Replica], everyone: list[Replica], load: float, cap: float, duration: float,
                 seed: int) -> dict[str, Any]:
    """bench/admission.py's run at `load` x `cap`, request n sent to targets[n % len(targets)]."""
    result = RunResult(load, load * cap)
    held = dict.fromkeys(REPLICAS, 0)

    async def sample() -> None:
        while True:
            states = await asyncio.gather(*(asyncio.to_thread(r.admission_state) for r in everyone))
            result.held_max = max(result.held_max, sum(int(s.get("held", 0)) for s in states))
            result.held_bytes_max = max(result.held_bytes_max, sum(int(s.get("held_bytes", 0)) for s in states))
            for r, s in zip(everyone, states):
                held[r.name] = max(held[r.name], int(s.get("held", 0)))
            await asyncio.sleep(0.1)

    before = {r.name: r.outcomes() for r in everyone}
    started = time.monotonic()
    result.sent = await open_loop([r.url for r in targets], result.rate, duration, seed, sample)
    wall_s = time.monotonic() - started  # the offered duration and the tail (held requests still out)
    per = {r.name: outcomes_delta(before[r.name], r.outcomes()) for r in everyone}
    state = everyone[0].admission_state()
    reserve_now = state.get("reserve_now") or {}
    result.sidecar = {"outcomes": summed(per), "reserved_slots": (state.get("settings") or {}).get("reserved_slots"),
                      "lower_reserve_now": reserve_now.get("lower")}
    figures = result.figures()
    shed = [s for s in result.sent if s.status == 429]
    figures.update(
        replicas=len(targets), duration_s=duration, wall_s=wall_s,
        shed_with_retry_after=sum(1 for s in shed if s.retry_after), shed_reasons=dict(Counter(s.reason for s in shed)),
        per_replica={r.name: replica_figures(result.sent[i::len(targets)] if i < len(targets) else [], per[r.name],
                                             held[r.name]) for i, r in enumerate(everyone)})
    return figures


def other_lower_per_interval(run: dict[str, Any], interval_s: float) -> float | None:
    """The derived condition's left side, as measured: the lower-band requests that the other replica(s) sent on
    to an engine per scrape interval, seen from the replica for which they are most, averaged over the run's
    wall time (the offered duration and the tail while held requests are still released)."""
    per = run["per_replica"]
    if run["replicas"] < 2:
        return None
    total = sum(p["lower_sent_on"] for p in per.values())
    return max(total - p["lower_sent_on"] for p in per.values()) / run["wall_s"] * interval_s


def interval_runs(pair: list[Replica], interval_s: float, cap: float, duration: float, seed: int,
                  reference: bool) -> dict[str, Any]:
    """At each load, one replica (the reference, B idle) then two, each after the previous run's held requests
    are gone; the same seed, so the same arrivals and mix."""
    runs: dict[str, list[dict[str, Any]]] = {"one": [], "two": []}
    for load in LOADS:
        for topology, targets in (("one", pair[:1]), ("two", pair)):
            if topology == "one" and not reference:
                continue
            time.sleep(TTL_S)
            r = asyncio.run(run_at(targets, pair, load, cap, duration, seed))
            r["other_lower_per_interval"] = other_lower_per_interval(r, interval_s)
            runs[topology].append(r)
            log.info("scrape %gs, %s replica(s), %.1fx: %s, outcomes %s", interval_s, topology, load,
                     json.dumps(r["status"]), json.dumps(r["sidecar"]["outcomes"]))
    return {"scrape_interval_s": interval_s, "runs_one": runs["one"], "runs_two": runs["two"],
            "figures": interval_figures(runs, interval_s)}


def p95_pair(runs: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    if len(runs) != len(LOADS):
        return None, None
    low, high = (r["objectives"]["critical"]["ttft_p95_s"] for r in runs)
    return low, high


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def interval_figures(runs: dict[str, list[dict[str, Any]]], interval_s: float) -> dict[str, Any]:
    one, two = p95_pair(runs["one"]), p95_pair(runs["two"])
    ratio_one, ratio_two = ratio(one[1], one[0]), ratio(two[1], two[0])
    high = runs["two"][-1] if runs["two"] else None
    reserved = high["sidecar"].get("lower_reserve_now") if high else None  # over the pool, as the run ended
    return {"scrape_interval_s": interval_s,
            "critical_ttft_p95_s_one": list(one), "critical_ttft_p95_s_two": list(two),
            "critical_ttft_p95_ratio_one": ratio_one, "critical_ttft_p95_ratio_two": ratio_two,
            "two_over_one_p95_at_1_5x": ratio(two[1], one[1]), "two_over_one_ratio": ratio(ratio_two, ratio_one),
            "lost": sum(r["lost"] for rs in runs.values() for r in rs),
            "other_lower_per_interval_at_1_5x": high["other_lower_per_interval"] if high else None,
            "lower_reserve": reserved}


def run(out_dir: Path, quick: bool = False, seed: int = 11, intervals: Sequence[float] = SCRAPE_INTERVALS_S,
        reference: bool = True) -> dict[str, Any]:
    duration = 8.0 if quick else 40.0
    out_dir.mkdir(parents=True, exist_ok=True)
    objectives = out_dir / "objectives.json"
    objectives.write_text(json.dumps(OBJECTIVES))
    results: dict[str, Any] = {"config": {
        "engines": ENGINES, "fleet_args": FLEET_ARGS, "mix": [list(m) for m in MIX], "objectives": OBJECTIVES,
        "ttl_s": TTL_S, "duration_s": duration, "seed": seed, "replicas": list(REPLICAS),
        "scrape_intervals_s": list(intervals), "loads": list(LOADS), "reference": reference}, "intervals": []}
    with FleetProc(out_dir / "logs", engines=ENGINES, base_ip=BASE_IP, port=free_port(),
                   extra_args=FLEET_ARGS) as fleet:
        for interval_s in intervals:
            args = sidecar_args(objectives, scrape_interval_s=interval_s)
            with replicas(fleet, out_dir / f"logs-scrape-{interval_s:g}s", args) as pair:
                if "capacity_rps" not in results:
                    results["capacity_rps"] = asyncio.run(capacity(pair[0].url, 4.0 if quick else 10.0))
                    log.info("capacity %.1f req/s (through replica A)", results["capacity_rps"])
                results["intervals"].append(
                    interval_runs(pair, interval_s, results["capacity_rps"], duration, seed, reference))
    results["figures"] = {"capacity_rps": results["capacity_rps"],
                          "intervals": [i["figures"] for i in results["intervals"]]}
    (out_dir / "admission_replicas.json").write_text(json.dumps(results, indent=2))
    return results


def outcome_text(outcomes: dict[str, float]) -> str:
    """"10: 120 admitted, 30 released; 0: ..." by band, highest first."""
    bands: dict[str, list[str]] = {}
    for key, n in outcomes.items():
        band, outcome = key.split("/", 1)
        bands.setdefault(band, []).append(f"{n:.0f} {outcome}")
    return "; ".join(f"{b}: {', '.join(v)}" for b, v in sorted(bands.items(), key=lambda kv: -int(kv[0])))


def row(interval_s: float, r: dict[str, Any]) -> str:
    o = r["objectives"]
    other = r["other_lower_per_interval"]
    per = " / ".join(f"{name} {outcome_text(p['outcomes']) or '-'}" for name, p in r["per_replica"].items())
    return (f"| {interval_s:g} s | {r['replicas']} | {r['load']:.1f}x ({r['rate']:.0f}/s) | {r['requests']} | "
            f"{r['status']} | {r['lost']} | {ms(o['critical']['ttft_p50_s'])} / {ms(o['critical']['ttft_p95_s'])} | "
            f"{ms(o['standard']['ttft_p95_s'])} | {o['batch']['served']} / {o['batch']['shed']} | "
            f"{outcome_text(r['sidecar']['outcomes'])} | {per} | {'-' if other is None else f'{other:.1f}'} | "
            f"{r['held_max']} |")


def table(results: dict[str, Any]) -> str:
    lines = [f"### Admission with two sidecar replicas (2 engines, capacity {results['capacity_rps']:.1f} req/s "
             "measured through A; the mix of bench/admission.py)", "",
             "| scrape | replicas | load | requests | statuses | lost | critical TTFT p50 / p95 | standard p95 | "
             "batch served / shed | outcomes (sum) | outcomes per replica | other replica's lower-band sent on "
             "per scrape | most held (sum) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for interval in results["intervals"]:
        for r in sorted(interval["runs_one"] + interval["runs_two"], key=lambda r: (r["replicas"], r["load"])):
            lines.append(row(interval["scrape_interval_s"], r))
    lines.append("")
    for f in results["figures"]["intervals"]:
        lines.append(f"- scrape {f['scrape_interval_s']:g} s: critical p95 1.5x over 0.7x, one replica "
                     f"**{num(f['critical_ttft_p95_ratio_one'])}**, two **{num(f['critical_ttft_p95_ratio_two'])}**; "
                     f"two over one at 1.5x {num(f['two_over_one_p95_at_1_5x'])}, of the ratios "
                     f"{num(f['two_over_one_ratio'])}; the other replica's lower-band requests sent on per scrape at "
                     f"1.5x {num(f['other_lower_per_interval_at_1_5x'], 1)} vs the reserve "
                     f"{f['lower_reserve']}; lost {f['lost']}")
    return "\n".join([*lines, ""])


def num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.admission_replicas", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8-second runs (a smoke test)")
    p.add_argument("--out", default="out/bench-admission-replicas")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--scrape-interval-s", type=float, nargs="+", default=list(SCRAPE_INTERVALS_S),
                   help="the sidecars' --scrape-interval-s, one sweep step each (default: 0.1 1.0)")
    p.add_argument("--no-reference", action="store_true", help="skip the one-replica reference runs")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    results = run(Path(args.out), args.quick, args.seed, args.scrape_interval_s, not args.no_reference)
    print(table(results))
    print(json.dumps(results["figures"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
