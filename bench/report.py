"""Markdown tables and the JSON record of one benchmark run."""

from __future__ import annotations

import math
from typing import Any

from .cases import CaseResults, StepResult
from .measure import ArmResult

TARGETS = {
    "transport_sidecar_cpu_us": 300.0,
    "decision_sidecar_cpu_us": 1500.0,
    "added_p99_ms": 3.0,
    "decisions_per_core_s": 1000.0,
    "picker_sidecar_cpu_us_per_chunk": 15.0,
}
ALONE, WITH = "envoy_alone", "envoy+sidecar"
# Case 7's arms (bench/picker.py) and, per prompt, the earlier case whose BUFFERED figure it is held against.
PICKER_ARMS = (("envoy_alone", "(a) Envoy alone"), ("buffered", "(b) + sidecar, BUFFERED"),
               ("full_duplex", "(c) + sidecar, full duplex"))
PICKER_CASES = {"picker": ("transport", "transport_sidecar_cpu_us"),
                "picker_decision": ("decision", "decision_sidecar_cpu_us")}


def _f(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{digits}f}"


def _pair(results: CaseResults, case: str) -> tuple[ArmResult | None, ArmResult | None]:
    arms = {a.arm: a for a in results.arms if a.case == case}
    return arms.get(ALONE), arms.get(WITH)


def added(alone: ArmResult | None, with_: ArmResult | None, key: str) -> float:
    if alone is None or with_ is None:
        return math.nan
    return with_.latency[key] - alone.latency[key]


def case_table(results: CaseResults, case: str, title: str, cpu_target_us: float | None) -> str:
    alone, with_ = _pair(results, case)
    if with_ is None:
        return ""

    def col(a: ArmResult | None, fn: Any, digits: int = 0) -> str:
        return "-" if a is None else _f(fn(a), digits)

    rows = [
        ("requests (errors)", col(alone, lambda a: a.requests) + f" ({col(alone, lambda a: a.errors)})",
         col(with_, lambda a: a.requests) + f" ({col(with_, lambda a: a.errors)})", "", "errors 0"),
        ("latency p50 ms", col(alone, lambda a: a.latency["p50_ms"], 2), col(with_, lambda a: a.latency["p50_ms"], 2),
         _f(added(alone, with_, "p50_ms"), 2), ""),
        ("latency p99 ms", col(alone, lambda a: a.latency["p99_ms"], 2), col(with_, lambda a: a.latency["p99_ms"], 2),
         _f(added(alone, with_, "p99_ms"), 2), f"added ≤ {TARGETS['added_p99_ms']:g} ms"),
        ("sidecar CPU µs/req", col(alone, lambda a: a.cpu_us_per_request.get("sidecar", math.nan)),
         col(with_, lambda a: a.cpu_us_per_request.get("sidecar", math.nan)), "",
         f"≤ {cpu_target_us:,.0f} µs" if cpu_target_us else ""),
        ("Envoy CPU µs/req", col(alone, lambda a: a.cpu_us_per_request.get("envoy", math.nan)),
         col(with_, lambda a: a.cpu_us_per_request.get("envoy", math.nan)),
         _f(_cpu_delta(alone, with_, "envoy")), "(peer: Envoy alone ~160)"),
        ("fleet CPU µs/req", col(alone, lambda a: a.cpu_us_per_request.get("fleet", math.nan)),
         col(with_, lambda a: a.cpu_us_per_request.get("fleet", math.nan)), "", ""),
    ]
    if with_.cpu_us_per_request.get("lmcache") is not None:
        rows.append(("LMCache ctrl CPU µs/req", col(alone, lambda a: a.cpu_us_per_request.get("lmcache", math.nan)),
                     col(with_, lambda a: a.cpu_us_per_request.get("lmcache", math.nan)), "", ""))
    rows.append(("load generator CPU µs/req", col(alone, lambda a: a.cpu_us_per_request.get("loadgen", math.nan)),
                 col(with_, lambda a: a.cpu_us_per_request.get("loadgen", math.nan)), "", ""))
    if with_.decisions:
        stages = ", ".join(f"{k} {v:,.0f}" for k, v in with_.stages_us.items())
        rows.append(("sidecar decision wall µs (mean)", "", _f(with_.decision_us), "", stages))
        if any(with_.lookups.values()):
            lk = with_.lookups
            rows.append(("LMCache lookups match/empty/failed", "",
                         f"{lk.get('match', 0):.0f}/{lk.get('empty', 0):.0f}/{lk.get('failed', 0):.0f}", "", ""))
    head = f"### {title} — {with_.rate:g} req/s for {with_.wall_s:.0f} s\n\n"
    lines = ["| figure | Envoy alone | Envoy + sidecar | added | target |", "|---|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    return head + "\n".join(lines) + "\n"


def _cpu_delta(alone: ArmResult | None, with_: ArmResult | None, proc: str) -> float:
    if alone is None or with_ is None:
        return math.nan
    return with_.cpu_us_per_request.get(proc, math.nan) - alone.cpu_us_per_request.get(proc, math.nan)


def _finite(x: float | None) -> bool:
    return x is not None and not math.isnan(x) and not math.isinf(x)


def _per_request(arm: ArmResult | None, counter: str) -> float:
    if arm is None or counter not in arm.counters:
        return math.nan
    return arm.counters[counter] / max(1, arm.requests)


def picker_figures(results: CaseResults, case: str) -> dict[str, Any] | None:
    """Case 7's derived figures, None when its BUFFERED or full-duplex arm is missing.

    The sidecar's CPU per response chunk = (its CPU per request in full duplex − in BUFFERED) / chunks per
    request. Chunks per request: the smaller of (1) the SSE events per response the client counted and (2)
    the ext_proc messages per request Envoy sent the sidecar in full duplex beyond those it sent in BUFFERED,
    less one for the response headers. (2) is below (1) when Envoy read several events as one chunk; taking
    the smaller divisor makes the figure an upper bound on the cost per chunk that really crossed. The
    numerator is every extra cost of full duplex (the body held and sent back, the response headers), so the
    figure is itself an upper bound on the cost of echoing one chunk."""
    arms = {a.arm: a for a in results.arms if a.case == case}
    buffered, duplex = arms.get("buffered"), arms.get("full_duplex")
    if buffered is None or duplex is None:
        return None
    cpu_b = buffered.cpu_us_per_request.get("sidecar", math.nan)
    cpu_d = duplex.cpu_us_per_request.get("sidecar", math.nan)
    msgs_b = _per_request(buffered, "stream_msgs_sent")
    msgs_d = _per_request(duplex, "stream_msgs_sent")
    events = duplex.sse_events_per_response
    crossed = msgs_d - msgs_b - 1.0
    divisors = [x for x in (events, crossed) if _finite(x) and x > 0]
    chunks = min(divisors) if divisors else math.nan
    delta = cpu_d - cpu_b
    per_chunk = delta / chunks if _finite(chunks) else math.nan
    target = TARGETS["picker_sidecar_cpu_us_per_chunk"]
    earlier_case, target_key = PICKER_CASES.get(case, ("", ""))
    earlier = next((a for a in results.arms if a.case == earlier_case and a.arm == WITH), None)
    return {
        "sidecar_cpu_us_buffered": cpu_b, "sidecar_cpu_us_full_duplex": cpu_d, "sidecar_cpu_us_added": delta,
        "sse_events_per_response": events, "ext_proc_msgs_per_request_buffered": msgs_b,
        "ext_proc_msgs_per_request_full_duplex": msgs_d, "response_chunks_crossed_per_request": crossed,
        "chunks_per_request": chunks, "sidecar_cpu_us_per_chunk": per_chunk,
        "target_us_per_chunk": target, "meets_per_chunk": per_chunk <= target if _finite(per_chunk) else None,
        "buffered_target_us": TARGETS.get(target_key, math.nan), "buffered_target_case": earlier_case,
        "buffered_same_run_us": earlier.cpu_us_per_request.get("sidecar", math.nan) if earlier else math.nan,
        "buffered_same_run_case": earlier_case if earlier else "",
    }


def picker_table(results: CaseResults, case: str, title: str) -> str:
    arms = {a.arm: a for a in results.arms if a.case == case}
    if not arms:
        return ""
    cols = [arms.get(key) for key, _ in PICKER_ARMS]
    alone = arms.get("envoy_alone")

    def cells(fn: Any) -> list[str]:
        return ["-" if a is None else fn(a) for a in cols]

    def with_added(a: ArmResult, table: str, key: str) -> str:
        mine = getattr(a, table).get(key, math.nan)
        if a is alone or alone is None:
            return _f(mine, 2)
        return f"{_f(mine, 2)} ({_f(mine - getattr(alone, table).get(key, math.nan), 2)})"

    def cpu(proc: str) -> Any:
        return lambda a: _f(a.cpu_us_per_request.get(proc, math.nan))

    def msgs(a: ArmResult) -> str:
        if a.arm == "envoy_alone":
            return "-"
        return (f"{_f(_per_request(a, 'stream_msgs_sent'), 1)} / {_f(_per_request(a, 'stream_msgs_received'), 1)}; "
                f"failed {_f(a.counters.get('streams_failed', math.nan))}, "
                f"bypassed {_f(a.counters.get('failure_mode_allowed', math.nan))}")

    fig = picker_figures(results, case)
    rows: list[tuple[str, list[str], str]] = [
        ("requests (errors)", cells(lambda a: f"{a.requests:,} ({a.errors:,})"), "errors 0"),
        ("latency to last byte p50 ms (added)", cells(lambda a: with_added(a, "latency", "p50_ms")), ""),
        ("latency to last byte p99 ms (added)", cells(lambda a: with_added(a, "latency", "p99_ms")), ""),
        ("TTFT p50 ms (added)", cells(lambda a: with_added(a, "ttft", "p50_ms")), ""),
        ("TTFT p99 ms (added)", cells(lambda a: with_added(a, "ttft", "p99_ms")), ""),
        ("SSE events per response (client)", cells(lambda a: _f(a.sse_events_per_response, 1)), ""),
        ("ext_proc messages per request sent / answered; streams failed, bypassed", cells(msgs), ""),
        ("sidecar CPU µs/req", cells(cpu("sidecar")), ""),
        ("Envoy CPU µs/req", cells(cpu("envoy")), ""),
        ("fleet CPU µs/req", cells(cpu("fleet")), ""),
    ]
    if any(a is not None and "lmcache" in a.cpu_us_per_request for a in cols):
        rows.append(("LMCache ctrl CPU µs/req", cells(cpu("lmcache")), ""))
    rows.append(("load generator CPU µs/req (cores busy; send lag p99 ms)",
                 cells(lambda a: f"{_f(a.cpu_us_per_request.get('loadgen', math.nan))} "
                                 f"({_f(a.cpu_per_wall_s.get('loadgen', math.nan), 2)}; "
                                 f"{_f(a.send_lag_p99_ms, 1)})"), "< 1 core"))
    rows.append(("other CPU on the machine meanwhile, cores (other runs; loadgen start-up)",
                 cells(lambda a: _f(a.cpu_per_wall_s.get("outside", math.nan), 2)), "~0"))
    if fig is not None:
        same_run = (f"; that case in this run: {_f(fig['buffered_same_run_us'])} µs"
                    if fig["buffered_same_run_case"] else "")
        buffered, limit = fig["sidecar_cpu_us_buffered"], fig["buffered_target_us"]
        verdict = ("yes" if buffered <= limit else "NO") if _finite(buffered) and _finite(limit) else "n/a"
        rows.append(("sidecar CPU µs/req, BUFFERED, held to the non-streamed case's target", ["", _f(buffered), ""],
                     f"≤ {_f(limit)} µs (the {fig['buffered_target_case']} case's target): {verdict}{same_run}"))
        meets = {True: "yes", False: "NO", None: "n/a"}[fig["meets_per_chunk"]]
        rows.append(("sidecar CPU per response chunk: ((c) − (b)) / chunks",
                     ["", "", f"{_f(fig['sidecar_cpu_us_per_chunk'], 1)} µs = {_f(fig['sidecar_cpu_us_added'])} µs / "
                              f"{_f(fig['chunks_per_request'], 1)}"],
                     f"≤ {fig['target_us_per_chunk']:g} µs: {meets}"))
    first = next(a for a in cols if a is not None)
    head = f"### {title} — {first.rate:g} req/s for {first.wall_s:.0f} s per arm\n\n"
    lines = ["| figure | " + " | ".join(label for _, label in PICKER_ARMS) + " | target |",
             "|---|---|---|---|---|"]
    lines += [f"| {name} | {' | '.join(vals)} | {target} |" for name, vals, target in rows]
    notes = []
    if fig is not None:
        notes.append(f"Chunks per request: {_f(fig['sse_events_per_response'], 1)} SSE events per response "
                     f"(client), {_f(fig['response_chunks_crossed_per_request'], 1)} response chunks crossed the "
                     "sidecar (Envoy's ext_proc messages per request, (c) − (b) − 1 for the response headers); "
                     "the smaller divides. It includes gRPC's cost of each chunk both ways; case 6 is the sidecar's "
                     "own code alone.")
    return head + "\n".join(lines) + "\n" + "".join(f"\n{n}\n" for n in notes)


def decisions_per_core(arm: ArmResult) -> float:
    cpu = arm.cpu_s.get("sidecar", 0.0)
    return arm.requests / cpu if cpu > 0 else math.nan


def steps_table(steps: list[StepResult]) -> str:
    if not steps:
        return ""
    lines = ["### Rate steps — full decision through Envoy + sidecar (loadaware + LMCache)\n",
             "| offered/s | achieved/s | errors | p50 ms | p99 ms | sidecar CPU s/s | sidecar µs/req | "
             "decisions/s per core | Envoy CPU s/s | fleet s/s | LMCache s/s | loadgen s/s | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in steps:
        a = s.arm
        w = a.cpu_per_wall_s
        lines.append(
            f"| {a.rate:g} | {a.achieved_rate:,.0f} | {a.errors} | {a.latency['p50_ms']:.2f} | "
            f"{a.latency['p99_ms']:.2f} | {w.get('sidecar', 0):.2f} | {a.cpu_us_per_request.get('sidecar', 0):,.0f} | "
            f"{_f(decisions_per_core(a))} | {w.get('envoy', 0):.2f} | {w.get('fleet', 0):.2f} | "
            f"{w.get('lmcache', 0):.2f} | {w.get('loadgen', 0):.2f} | {'sustained' if s.ok else s.reason} |")
    return "\n".join(lines) + "\n"


def summary(results: CaseResults) -> dict[str, Any]:
    t_alone, t_with = _pair(results, "transport")
    d_alone, d_with = _pair(results, "decision")
    sustained = [s for s in results.steps if s.ok]
    best = max(sustained, key=lambda s: s.rate) if sustained else None
    per_core = [decisions_per_core(s.arm) for s in results.steps if s.arm.requests]
    return {
        "transport_sidecar_cpu_us": t_with.cpu_us_per_request.get("sidecar") if t_with else None,
        "transport_added_p50_ms": added(t_alone, t_with, "p50_ms"),
        "transport_added_p99_ms": added(t_alone, t_with, "p99_ms"),
        "decision_sidecar_cpu_us": d_with.cpu_us_per_request.get("sidecar") if d_with else None,
        "decision_added_p50_ms": added(d_alone, d_with, "p50_ms"),
        "decision_added_p99_ms": added(d_alone, d_with, "p99_ms"),
        "highest_sustained_rate": best.rate if best else None,
        "decisions_per_core_s_at_highest": decisions_per_core(best.arm) if best else None,
        "decisions_per_core_s_best": max(per_core) if per_core else None,
        **{f"{case}_sidecar_cpu_us_per_chunk": (f["sidecar_cpu_us_per_chunk"] if f else None)
           for case, f in ((c, picker_figures(results, c)) for c in PICKER_CASES)},
        **{f"{case}_buffered_sidecar_cpu_us": (f["sidecar_cpu_us_buffered"] if f else None)
           for case, f in ((c, picker_figures(results, c)) for c in PICKER_CASES)},
    }


def summary_table(s: dict[str, Any], rate: float) -> str:
    def meets(x: Any, limit: float, upper: bool = True) -> str:
        if x is None or (isinstance(x, float) and math.isnan(x)):
            return "n/a"
        return "yes" if (x <= limit if upper else x >= limit) else "NO"

    rows = [
        ("sidecar CPU per request, transport (leastload)", f"{_f(s['transport_sidecar_cpu_us'])} µs",
         f"≤ {TARGETS['transport_sidecar_cpu_us']:g} µs",
         meets(s["transport_sidecar_cpu_us"], TARGETS["transport_sidecar_cpu_us"])),
        ("sidecar CPU per request, 1,578-token decision", f"{_f(s['decision_sidecar_cpu_us'])} µs",
         f"≤ {TARGETS['decision_sidecar_cpu_us']:,.0f} µs",
         meets(s["decision_sidecar_cpu_us"], TARGETS["decision_sidecar_cpu_us"])),
        (f"added p99 at {rate:g} req/s, transport", f"{_f(s['transport_added_p99_ms'], 2)} ms",
         f"≤ {TARGETS['added_p99_ms']:g} ms", meets(s["transport_added_p99_ms"], TARGETS["added_p99_ms"])),
        (f"added p99 at {rate:g} req/s, full decision", f"{_f(s['decision_added_p99_ms'], 2)} ms",
         f"≤ {TARGETS['added_p99_ms']:g} ms", meets(s["decision_added_p99_ms"], TARGETS["added_p99_ms"])),
        ("added p50, transport / full decision",
         f"{_f(s['transport_added_p50_ms'], 2)} / {_f(s['decision_added_p50_ms'], 2)} ms", "", ""),
        ("decisions/s on one sidecar core (at highest sustained step)",
         _f(s["decisions_per_core_s_at_highest"]), f"≥ {TARGETS['decisions_per_core_s']:,.0f}",
         meets(s["decisions_per_core_s_at_highest"], TARGETS["decisions_per_core_s"], upper=False)),
        ("highest sustained rate, full decision (0 errors, ≥95% achieved, p99 ≤ limit)",
         f"{_f(s['highest_sustained_rate'])} req/s", "", ""),
    ]
    for case, label in (("picker", "tiny prompt, leastload"), ("picker_decision", "1,578-token decision")):
        per_chunk = s.get(f"{case}_sidecar_cpu_us_per_chunk")
        rows.append((f"sidecar CPU per streamed response chunk, full duplex ({label})", f"{_f(per_chunk, 1)} µs",
                     f"≤ {TARGETS['picker_sidecar_cpu_us_per_chunk']:g} µs",
                     meets(per_chunk, TARGETS["picker_sidecar_cpu_us_per_chunk"])))
    for case, key, label in (("picker", "transport_sidecar_cpu_us", "tiny prompt, leastload"),
                             ("picker_decision", "decision_sidecar_cpu_us", "1,578-token decision")):
        buffered = s.get(f"{case}_buffered_sidecar_cpu_us")
        rows.append((f"sidecar CPU per request, BUFFERED, streamed response ({label})", f"{_f(buffered)} µs",
                     f"≤ {TARGETS[key]:,.0f} µs", meets(buffered, TARGETS[key])))
    lines = ["### Summary\n", "| figure | measured | target | meets |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines) + "\n"
