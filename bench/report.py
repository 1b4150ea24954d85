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
}
ALONE, WITH = "envoy_alone", "envoy+sidecar"


def _f(x: float, digits: int = 0) -> str:
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
    lines = ["### Summary\n", "| figure | measured | target | meets |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines) + "\n"
