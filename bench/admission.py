"""Case `admission`: a shared fleet past its capacity, through the real Envoy (BUFFERED, envoy/envoy.yaml) and the
sidecar with --admission on, over simulated engines.

Three objectives (critical 10, standard 0, batch -1) and, in the standard band, two tenants offering 10:1. The
same traffic (mix, tenants, seed) at 0.7x and at 1.5x the fleet's measured capacity, open loop (Poisson), each
request streamed so its first token is timed. Printed per run: requests answered by status and lost (no answer
within the client's time-out), TTFT p50/p95 per objective, and the sidecar's own record (admission outcomes,
the Jain index of the standard band's releases while its tenants competed, the most requests and bytes held).

    python -m bench.admission [--quick] [--out DIR] [--seed N] [--control] [--slower K] [--repeat R]

--control adds a fleet with twice the batch slots (the same engines, --max-num-seqs doubled) at the same two
request rates: the 1.5x rate is then 0.75x of its capacity, so nothing is held or queued, but the machine
carries the same requests, tokens and streams. The critical band's p95 there over its p95 at 0.7x is what the
rate alone costs on this machine (the load generator, Envoy, the sidecar and the engines share its cores); the
saturated run's p95 over the control's at the same rate is what saturation costs the critical band.

--slower K makes every decode step K times longer and every run K times longer: the fleet's capacity, and so both
request rates, are K times lower while each run sends as many requests. Saturation is the same (1.5x of what the
engines carry); the machine carries 1/K of the requests, streams and tokens a second, so what the load generator,
Envoy and the engines cost each other on shared cores shrinks with it.

--repeat R runs the two loads R times in turn (repeat k sends seed N + 1000k, repeat 0 seed N itself) and takes
the critical band's p95 at each load over every repeat's requests together: a p95 over ~300 requests is the 15th
slowest, and on a shared machine it moves by a third between two runs of the same traffic. Each repeat's own
ratio is printed beside the pooled one. Printed too: how many of the critical band's requests waited in admission
longer than 1, 10 and 50 ms at 1.5x (the sidecar's queue-duration histogram).

Targets (issue 33): critical TTFT p95 at 1.5x within 1.2x of 0.7x; every request answered (served, 429 or
503); standard band Jain index >= 0.95; held requests and bytes within their configured bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from testkit.metrics_text import metric_sum
from testkit.stack import Stack

from .schedule import arrival_offsets
from .stats import percentile

log = logging.getLogger("bench.admission")

# Engines slow enough that the fleet saturates at a rate the loopback carries easily: a request holds a batch
# slot for MAX_TOKENS decode steps of DECODE_MS.
ENGINES = 2
MAX_NUM_SEQS = 8
DECODE_MS = 10.0
MAX_TOKENS = 30


def fleet_args(max_num_seqs: int = MAX_NUM_SEQS, slower: float = 1.0) -> list[str]:
    """The simulated engines' flags: `max_num_seqs` batch slots, each decode step `slower` x DECODE_MS."""
    return ["--max-num-seqs", str(max_num_seqs), "--decode-base-ms", f"{DECODE_MS * slower:g}",
            "--decode-per-seq-ms", "0", "--prefill-tokens-per-s", "200000", "--prefill-overhead-ms", "2"]


FLEET_ARGS = fleet_args()
OBJECTIVES = {"critical": {"priority": 10}, "standard": {"priority": 0}, "batch": {"priority": -1}}
# The offered mix: critical and standard together fit in the capacity at 1.5x (60% of 1.5x = 0.9x); batch, the
# sheddable rest, is what admission sheds. The standard band's two tenants offer 10:1.
MIX = (("critical", "tenant-a", 0.10), ("standard", "tenant-heavy", 0.50 * 10 / 11),
       ("standard", "tenant-light", 0.50 / 11), ("batch", "tenant-a", 0.40))
TOP_OBJECTIVE = "critical"
TOP_PRIORITY = str(OBJECTIVES[TOP_OBJECTIVE]["priority"])
WAITED_OVER_S = (0.001, 0.01, 0.05)  # the top band's admission waits counted above these (histogram buckets)
REPEAT_SEED_STEP = 1000  # repeat k of seed N sends seed N + k x this (repeat 0 is seed N itself)
TTL_S = 5.0
MAX_HELD = 400
MAX_HELD_BYTES = 4 * 1024 * 1024
CLIENT_TIMEOUT_S = 60.0


@dataclass
class Sent:
    objective: str
    tenant: str
    status: int = 0  # 0: no answer (lost or hung)
    ttft_s: float | None = None
    total_s: float | None = None
    reason: str = ""
    retry_after: str | None = None  # the Retry-After of an answer other than 200


@dataclass
class RunResult:
    load: float  # x capacity
    rate: float
    sent: list[Sent] = field(default_factory=list)
    sidecar: dict[str, Any] = field(default_factory=dict)
    held_max: int = 0
    held_bytes_max: int = 0

    def figures(self) -> dict[str, Any]:
        statuses = Counter(s.status for s in self.sent)
        by_objective: dict[str, dict[str, Any]] = {}
        for objective in OBJECTIVES:
            served = [s.ttft_s for s in self.sent if s.objective == objective and s.status == 200
                      and s.ttft_s is not None]
            shed = sum(1 for s in self.sent if s.objective == objective and s.status == 429)
            by_objective[objective] = {
                "sent": sum(1 for s in self.sent if s.objective == objective), "served": len(served), "shed": shed,
                "ttft_p50_s": percentile(served, 50) if served else None,
                "ttft_p95_s": percentile(served, 95) if served else None}
        tenants = Counter(s.tenant for s in self.sent if s.objective == "standard" and s.status == 200)
        top = sorted(round(s.ttft_s * 1e3, 2) for s in self.sent
                     if s.objective == TOP_OBJECTIVE and s.status == 200 and s.ttft_s is not None)
        return {"load": self.load, "rate": self.rate, "requests": len(self.sent),
                "critical_ttft_ms": top,  # every one, so that runs can be pooled
                "status": {str(k): v for k, v in sorted(statuses.items())}, "lost": statuses.get(0, 0),
                "objectives": by_objective, "standard_served_by_tenant": dict(tenants),
                "held_max": self.held_max, "held_bytes_max": self.held_bytes_max, "sidecar": self.sidecar}


def body(n: int, objective: str) -> bytes:
    return json.dumps({"model": "tiny-model", "prompt": f"request {n} for {objective}: say something",
                       "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}).encode()


async def one(http: aiohttp.ClientSession, url: str, n: int, record: Sent) -> None:
    started = time.monotonic()
    headers = {"content-type": "application/json", "x-gateway-inference-objective": record.objective,
               "x-gateway-inference-fairness-id": record.tenant, "x-request-id": f"bench-{n}"}
    try:
        async with http.post(url + "/v1/completions", data=body(n, record.objective), headers=headers) as resp:
            if resp.status == 200:
                async for _chunk in resp.content.iter_any():
                    if record.ttft_s is None:
                        record.ttft_s = time.monotonic() - started
            else:
                await resp.read()
                record.reason = resp.headers.get("x-loadaware-request-dropped-reason", "")
                record.retry_after = resp.headers.get("retry-after")
            record.status = resp.status
            record.total_s = time.monotonic() - started
    except (aiohttp.ClientError, TimeoutError) as exc:
        record.reason = type(exc).__name__


async def open_loop(url: str | Sequence[str], rate: float, duration: float, seed: int, sample: Any) -> list[Sent]:
    """The requests in order; with several URLs the n-th goes to url[n % len(url)] (replicas in turn)."""
    urls = [url] if isinstance(url, str) else list(url)
    rng = random.Random(seed)
    weights = [w for _, _, w in MIX]
    offsets = arrival_offsets(rate, duration, arrivals="poisson", seed=seed)
    records = [Sent(*rng.choices(MIX, weights)[0][:2]) for _ in offsets]
    connector = aiohttp.TCPConnector(limit=2048)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as http:
        start = time.monotonic()
        tasks = []
        sampler = asyncio.create_task(sample())
        for n, (offset, record) in enumerate(zip(offsets, records)):
            delay = start + offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(http, urls[n % len(urls)], n, record)))
        await asyncio.gather(*tasks)
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
    return records


async def capacity(url: str, seconds: float) -> float:
    """Completions per second with every engine's batch full (closed loop, 2x the fleet's batch slots)."""
    done = 0
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as http:
        async def worker(w: int) -> None:
            nonlocal done
            n = 0
            while time.monotonic() < stop:
                record = Sent("critical", "calibration")
                await one(http, url, w * 100_000 + n, record)
                n += 1
                if record.status == 200 and time.monotonic() < stop:
                    done += 1
        started = time.monotonic()
        await asyncio.gather(*(worker(w) for w in range(2 * ENGINES * MAX_NUM_SEQS)))
    return done / (time.monotonic() - started)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


async def run_at(stack: Stack, load: float, cap: float, duration: float, seed: int) -> RunResult:
    assert stack.sidecar is not None
    debug = stack.sidecar.debug_url
    result = RunResult(load, load * cap)

    async def sample() -> None:
        while True:
            state = await asyncio.to_thread(get_json, f"{debug}/debug/state")
            admission = state.get("admission") or {}
            result.held_max = max(result.held_max, int(admission.get("held", 0)))
            result.held_bytes_max = max(result.held_bytes_max, int(admission.get("held_bytes", 0)))
            await asyncio.sleep(0.1)

    before = metrics_of(stack)
    holds_before = (get_json(f"{debug}/debug/state").get("admission") or {}).get("top_holds") or {}
    result.sent = await open_loop(stack.url, result.rate, duration, seed, sample)
    after = metrics_of(stack)
    state = get_json(f"{debug}/debug/state").get("admission") or {}
    result.sidecar = {"outcomes": outcomes_delta(before, after),
                      "jain_index": state.get("jain_index"), "contended_releases": state.get("contended_releases"),
                      "slots": state.get("slots"), "top_holds": top_holds_delta(holds_before,
                                                                                state.get("top_holds") or {})}
    return result


def top_holds_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The top band's holds during a run (/debug/state's admission.top_holds read before and after it): their
    count by cause, and the last ones the sidecar kept that were not there before."""
    seen = {hold.get("at") for hold in before.get("last", [])}
    causes = {cause: n - before.get("by_cause", {}).get(cause, 0) for cause, n in after.get("by_cause", {}).items()}
    return {"by_cause": {cause: n for cause, n in causes.items() if n},
            "last": [hold for hold in after.get("last", []) if hold.get("at") not in seen]}


def own_count_bound(hold: dict[str, Any]) -> bool:
    """Was a hold's room bounded by the sidecar's own count in flight rather than the scrape: on some engine it
    counted more requests of its own than the scrape showed running and waiting (an end not heard yet)?"""
    return any(e.get("running") is not None and e.get("own", 0) > e["running"] + e["waiting"] + e.get("own_since", 0)
               for e in hold.get("engines", []))


def metrics_of(stack: Stack) -> dict[str, float]:
    assert stack.sidecar is not None
    return outcomes_of(stack.sidecar.metrics_listen)


def outcomes_of(metrics_listen: str) -> dict[str, float]:
    """The sidecar's admission outcomes ("priority/outcome" -> count) from its /metrics at HOST:PORT."""
    with urllib.request.urlopen(f"http://{metrics_listen}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for priority in ("10", "0", "-1"):
        for outcome in ("admitted", "released", "placed_ttl", "placed_full", "rejected_queue_full", "rejected_ttl",
                        "evicted"):
            value = metric_sum(text, "loadaware_flow_control_requests_total",
                               {"priority": priority, "outcome": outcome})
            if value:
                out[f"{priority}/{outcome}"] = value
    out.update(top_waits(text))
    return out


def top_waits(metrics_text: str) -> dict[str, float]:
    """How many of the top band's requests waited in admission longer than each of WAITED_OVER_S (every outcome;
    one admitted at once waited 0), from the sidecar's queue-duration histogram."""
    name = "loadaware_flow_control_request_queue_duration_seconds"
    total = metric_sum(metrics_text, name + "_count", {"priority": TOP_PRIORITY})
    return {f"{TOP_PRIORITY}/waited>{over * 1e3:g}ms":
            total - metric_sum(metrics_text, name + "_bucket", {"priority": TOP_PRIORITY, "le": str(over)})
            for over in WAITED_OVER_S}


def outcomes_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after[k] != before.get(k)}


def sidecar_args(objectives: Path, reserved_slots: int | None = None, scrape_interval_s: float = 0.1,
                 late_reserved_slots: int | None = None) -> list[str]:
    """The sidecar's admission flags for this case (the objectives file at `objectives`)."""
    args = ["--admission", "on", "--objectives", str(objectives), "--admission-ttl-s", str(TTL_S),
            "--admission-max-held", str(MAX_HELD), "--admission-max-held-bytes", str(MAX_HELD_BYTES),
            "--scrape-interval-s", f"{scrape_interval_s:g}", "--log-level", "warning"]
    if reserved_slots is not None:  # else the sidecar's default
        args += ["--reserved-slots", str(reserved_slots)]
    if late_reserved_slots is not None:
        args += ["--late-reserved-slots", str(late_reserved_slots)]
    return args


def run(out_dir: Path, quick: bool = False, seed: int = 11, reserved_slots: int | None = None,
        control: bool = False, slower: float = 1.0, late_reserved_slots: int | None = None,
        admission_off: bool = True, repeat: int = 1) -> dict[str, Any]:
    duration = (8.0 if quick else 40.0) * slower
    fleet = fleet_args(slower=slower)
    out_dir.mkdir(parents=True, exist_ok=True)
    objectives = out_dir / "objectives.json"
    objectives.write_text(json.dumps(OBJECTIVES))
    admission_args = sidecar_args(objectives, reserved_slots, late_reserved_slots=late_reserved_slots)
    results: dict[str, Any] = {"config": {
        "engines": ENGINES, "max_num_seqs": MAX_NUM_SEQS, "decode_ms": DECODE_MS * slower, "max_tokens": MAX_TOKENS,
        "mix": [list(m) for m in MIX], "objectives": OBJECTIVES, "ttl_s": TTL_S, "max_held": MAX_HELD,
        "max_held_bytes": MAX_HELD_BYTES, "duration_s": duration, "seed": seed, "reserved_slots": reserved_slots,
        "late_reserved_slots": late_reserved_slots, "repeat": repeat}}
    with Stack(out_dir / "logs", engines=ENGINES, lmcache=False, sidecar_args=admission_args,
               fleet_args=fleet) as stack:
        cap = asyncio.run(capacity(stack.url, (4.0 if quick else 10.0) * slower))
        results["capacity_rps"] = cap
        log.info("capacity %.1f req/s", cap)
        runs = []
        for k in range(repeat):  # the two loads in turn, so that a drift of the machine falls on both
            for load in (0.7, 1.5):
                time.sleep(TTL_S)  # the previous run's held and queued requests are gone
                r = asyncio.run(run_at(stack, load, cap, duration, seed + k * REPEAT_SEED_STEP))
                runs.append({**r.figures(), "repeat": k})
                log.info("%.1fx (repeat %d): %s", load, k, json.dumps(runs[-1]["status"]))
        results["runs"] = runs
    off: dict[str, Any] | None = None
    if admission_off:  # the same 1.5x traffic without admission: every request goes to an engine and queues there
        plain_args = ["--scrape-interval-s", "0.1", "--log-level", "warning"]
        with Stack(out_dir / "logs-off", engines=ENGINES, lmcache=False, sidecar_args=plain_args,
                   fleet_args=fleet) as stack:
            off = asyncio.run(run_at(stack, 1.5, cap, duration, seed)).figures()
            off["admission"] = "off"
            log.info("1.5x, admission off: %s", json.dumps(off["status"]))
            results["runs_off"] = [off]
    if control:
        results["runs_control"] = control_runs(out_dir, admission_args, cap, duration, seed, slower)
    lows, highs = ([r for r in results["runs"] if r["load"] == load] for load in (0.7, 1.5))
    p95 = (pooled_p95_s(lows), pooled_p95_s(highs))
    jain = (highs[0]["sidecar"].get("jain_index") or {}).get("0")
    results["figures"] = {
        "critical_ttft_p95_ratio": p95[1] / p95[0] if p95[0] and p95[1] else None,
        "critical_ttft_p95_s": list(p95),
        "critical_ttft_p95_ratio_each": [ratio(low, high) for low, high in zip(lows, highs)],
        "critical_ttft_p95_s_admission_off": off["objectives"]["critical"]["ttft_p95_s"] if off else None,
        "lost": sum(r["lost"] for r in results["runs"]), "standard_jain_index": jain,
        "held_max": max(r["held_max"] for r in highs), "held_bytes_max": max(r["held_bytes_max"] for r in highs)}
    if control:
        c_low, c_high = (r["objectives"]["critical"]["ttft_p95_s"] for r in results["runs_control"])
        results["figures"]["control_critical_ttft_p95_s"] = [c_low, c_high]
        results["figures"]["rate_alone_ratio"] = c_high / p95[0] if c_high and p95[0] else None
        results["figures"]["saturation_alone_ratio"] = p95[1] / c_high if c_high and p95[1] else None
    (out_dir / "admission.json").write_text(json.dumps(results, indent=2))
    return results


def pooled_p95_s(runs: Sequence[dict[str, Any]]) -> float | None:
    """The top band's TTFT p95 over every request of `runs` together (repeats of one load), in seconds."""
    ttfts = [t for r in runs for t in r["critical_ttft_ms"]]
    return percentile(ttfts, 95) / 1e3 if ttfts else None


def ratio(low: dict[str, Any], high: dict[str, Any]) -> float | None:
    """One repeat's top-band p95 at 1.5x over its p95 at 0.7x."""
    a, b = (r["objectives"][TOP_OBJECTIVE]["ttft_p95_s"] for r in (low, high))
    return b / a if a and b else None


def control_runs(out_dir: Path, admission_args: list[str], cap: float, duration: float,
                 seed: int, slower: float = 1.0) -> list[dict[str, Any]]:
    """The same two request rates on a fleet with twice the batch slots (the module's docstring)."""
    runs = []
    with Stack(out_dir / "logs-control", engines=ENGINES, lmcache=False, sidecar_args=admission_args,
               fleet_args=fleet_args(2 * MAX_NUM_SEQS, slower)) as stack:
        for load in (0.7, 1.5):
            time.sleep(TTL_S)
            r = asyncio.run(run_at(stack, load, cap, duration, seed)).figures()
            r["control"] = True
            runs.append(r)
            log.info("control, %.1fx rate: %s", load, json.dumps(r["status"]))
    return runs


def table(results: dict[str, Any]) -> str:
    f = results["figures"]
    lines = [f"### Admission under saturation (2 engines, {results['config']['decode_ms']:g} ms a decode step, "
             f"capacity {results['capacity_rps']:.1f} req/s measured; "
             f"critical 10%, standard 50% (two tenants 10:1), batch 40%)", "",
             "| load | requests | statuses | lost | critical TTFT p50 / p95 | standard p95 | batch served / shed |",
             "|---|---|---|---|---|---|---|"]
    for r in results["runs"] + results.get("runs_off", []) + results.get("runs_control", []):
        o = r["objectives"]
        label = f"{r['load']:.1f}x ({r['rate']:.0f}/s){', admission off' if r.get('admission') == 'off' else ''}"
        label += f", repeat {r['repeat']}" if results["config"].get("repeat", 1) > 1 and "repeat" in r else ""
        label += ", control (twice the slots)" if r.get("control") else ""
        lines.append(f"| {label} | {r['requests']} | {r['status']} | {r['lost']} | "
                     f"{_s(o['critical']['ttft_p50_s'])} / {_s(o['critical']['ttft_p95_s'])} | "
                     f"{_s(o['standard']['ttft_p95_s'])} | {o['batch']['served']} / {o['batch']['shed']} |")
    pooled = f["critical_ttft_p95_ratio"]
    each = ", ".join("-" if x is None else f"{x:.2f}x" for x in f.get("critical_ttft_p95_ratio_each", []))
    waited: Counter[str] = Counter()
    for r in results["runs"]:
        if r["load"] == 1.5:
            waited.update({k.split("/", 1)[1]: v for k, v in r["sidecar"].get("outcomes", {}).items()
                           if k.startswith(f"{TOP_PRIORITY}/waited")})
    causes: Counter[str] = Counter()
    kept = [hold for r in results["runs"] if r["load"] == 1.5
            for hold in r["sidecar"].get("top_holds", {}).get("last", [])]
    for r in results["runs"]:
        if r["load"] == 1.5:
            causes.update(r["sidecar"].get("top_holds", {}).get("by_cause", {}))
    lines += ["", f"- critical TTFT p95, 1.5x over 0.7x: **{pooled:.2f}x** (target <= 1.2x)"
              + (f"; each repeat: {each}" if results["config"].get("repeat", 1) > 1 else "") if pooled else
              "- critical TTFT p95 ratio: not measured",
              f"- critical requests that waited in admission at 1.5x (every repeat): "
              f"{', '.join(f'{k} {v:.0f}' for k, v in waited.items()) or 'none'}",
              f"- critical holds at 1.5x by cause (loadaware/admission/top_holds.py): "
              f"{', '.join(f'{k} {v}' for k, v in sorted(causes.items())) or 'none'}; of the last {len(kept)} kept, "
              f"{sum(own_count_bound(h) for h in kept)} with some engine's room bounded by the sidecar's own count "
              f"(an end not heard yet)",
              f"- lost (no answer within {CLIENT_TIMEOUT_S:.0f} s): **{f['lost']}** (target 0)",
              f"- standard band, Jain index of releases while its tenants competed: **{f['standard_jain_index']}** "
              "(target >= 0.95)",
              *([f"- control: critical p95 at the 1.5x rate with twice the slots over 0.7x (the rate alone): "
                 f"**{f['rate_alone_ratio']:.2f}x**; saturated over the control at the same rate: "
                 f"**{f['saturation_alone_ratio']:.2f}x**"] if f.get("rate_alone_ratio") and
                f.get("saturation_alone_ratio") else []),
              f"- most held: {f['held_max']} requests, {f['held_bytes_max']:,} bytes (bounds {MAX_HELD}, "
              f"{MAX_HELD_BYTES:,})", ""]
    return "\n".join(lines)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.admission", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8-second runs (a smoke test)")
    p.add_argument("--out", default="out/bench-admission")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--reserved-slots", type=int, default=None, help="the sidecar's --reserved-slots (default: its own)")
    p.add_argument("--late-reserved-slots", type=int, default=None,
                   help="the sidecar's --late-reserved-slots (default: its own)")
    p.add_argument("--no-admission-off", action="store_true",
                   help="skip the run of the same 1.5x traffic with admission off")
    p.add_argument("--control", action="store_true", help="also the same rates on a fleet with twice the slots")
    p.add_argument("--repeat", type=int, default=1,
                   help="run both loads this many times in turn (repeat k sends seed + 1000k); the ratio is of "
                        "the p95s over every repeat's requests together")
    p.add_argument("--slower", type=float, default=1.0,
                   help="decode steps and runs this many times longer: the same saturation at 1/K the request rate")
    args = p.parse_args(argv)
    if args.slower < 1:
        p.error("--slower is at least 1")
    if args.repeat < 1:
        p.error("--repeat is at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    results = run(Path(args.out), args.quick, args.seed, args.reserved_slots, args.control, args.slower,
                  args.late_reserved_slots, not args.no_admission_off, args.repeat)
    print(table(results))
    print(json.dumps(results["figures"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
