"""Case 8's figures (one dict per row, for results.json) and its markdown table."""

from __future__ import annotations

import math
from typing import Any

from .table import TableRow, router_procs

# Column per router process: (key in the row's per-process CPU, heading).
PROCESS_COLUMNS = (("envoy", "Envoy"), ("sidecar", "sidecar"), ("router", "peer router"),
                   ("lmcache", "LMCache ctrl"))


def _f(x: float | None, digits: int = 0) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:,.{digits}f}"


def total_cpu_us(row: TableRow) -> float:
    """CPU per request of the row's routing processes together (router_procs), µs; NaN without figures."""
    if row.result is None:
        return math.nan
    return sum(row.result.cpu_us_per_request.get(p, math.nan) for p in router_procs(row.arm))


def fastest_peer_us(rows: list[TableRow]) -> float:
    """The lowest total CPU per request among the peer rows that ran; NaN when none did."""
    peers = [total_cpu_us(r) for r in rows if r.arm.kind == "peer" and r.result is not None]
    peers = [t for t in peers if not math.isnan(t)]
    return min(peers) if peers else math.nan


def row_figures(rows: list[TableRow]) -> list[dict[str, Any]]:
    fastest = fastest_peer_us(rows)
    out: list[dict[str, Any]] = []
    for row in rows:
        arm, res = row.arm, row.result
        fig: dict[str, Any] = {"key": arm.key, "name": arm.name, "label": arm.label, "mode": arm.mode,
                               "error": row.error or None, "router_processes": list(router_procs(arm))}
        if res is not None:
            total = total_cpu_us(row)
            fig.update(
                cpu_us_per_request={p: res.cpu_us_per_request[p] for p in router_procs(arm)
                                    if p in res.cpu_us_per_request},
                cpu_us_per_request_total=total,
                ratio_to_fastest_peer=total / fastest if fastest > 0 else math.nan,
                p50_ms=res.latency.get("p50_ms", math.nan), p99_ms=res.latency.get("p99_ms", math.nan),
                offered_rate=res.rate, achieved_rate=res.achieved_rate, requests=res.requests, ok=res.ok,
                failures=res.errors, statuses=res.statuses,
                fleet_cpu_us_per_request=res.cpu_us_per_request.get("fleet", math.nan),
                other_cpu_us_per_request=res.cpu_us_per_request.get("outside", math.nan),
                decision_us=res.decision_us, stages_us=res.stages_us, lookups=res.lookups,
                prefix_state=row.prefix_state,
            )
        out.append(fig)
    return out


def table_markdown(figs: list[dict[str, Any]], rate: float, duration_s: float) -> str:
    heads = ["", "router", "mode", "CPU µs/req (total)", *(h for _, h in PROCESS_COLUMNS), "p50 ms", "p99 ms",
             "achieved req/s", "failures", "× fastest peer", "other CPU on box µs/req"]
    lines = [f"### 8. Routers side by side: 1,578-token /v1/completions, {rate:g} req/s open loop, {duration_s:g} s "
             "per row, same engines\n",
             "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for f in figs:
        if "cpu_us_per_request" not in f:
            cells = [f["key"], f["label"], f["mode"], f"not run: {f['error'] or 'no result'}"]
            cells += [""] * (len(heads) - len(cells))
        else:
            per = f["cpu_us_per_request"]
            cells = [f["key"], f["label"], f["mode"], _f(f["cpu_us_per_request_total"]),
                     *(_f(per[p]) if p in per else "" for p, _ in PROCESS_COLUMNS),
                     _f(f["p50_ms"], 2), _f(f["p99_ms"], 2), _f(f["achieved_rate"]), str(f["failures"]),
                     _f(f["ratio_to_fastest_peer"], 2), _f(f["other_cpu_us_per_request"])]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "CPU: utime+stime of each routing process over the measured window, per request sent. Total = "
              "Envoy + sidecar (+ the LMCache controller where the sidecar queries it), or the peer router alone "
              "(clients reach the peers directly). × fastest peer: total over the lowest peer total. Other CPU on "
              "box: what the machine ran meanwhile besides the routers, the engines, the LMCache controller and the "
              "load generator (other jobs sharing the cores): the row's noise."]
    return "\n".join(lines) + "\n"
