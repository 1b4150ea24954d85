"""The mixed soak's report: per configuration, RSS and live-malloc growth over the window, every bound reached
and held, failed requests, in flight after the load; the targets printed beside the figures. JSON and
markdown (`python -m bench.soak` writes both into --out)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .soak import Sample
from .soak_bounds import CLOSED_LABELS, BoundSpec, BoundVerdict, judge, judge_events, judge_plateau, new_after

if TYPE_CHECKING:
    from .soak_mixed import MixedConfig, ModeRun

GROWTH_TARGET_PCT = 1.0
PARENT_SLACK_S = 5.0
MAX_LATE_SHOWN = 12  # label sets first seen in the second half, named in the report
FAILURES_SHOWN = 10  # follow-up 404s not excused, kept in the report with who answered them


def growth_pct(samples: Sequence[Sample], attr: str, start_s: float, end_s: float) -> dict[str, float] | None:
    """{t0, t1, start, end, pct} of a sample field between the samples nearest `start_s` and `end_s` (None when
    the field was never read), and `fit_pct`: the least-squares line through every sample between them, its rise
    over the window as a share of its start (an end sample can fall on a burst; every burst sample pulls the line:
    neither view is free of the bursts, so the report shows both)."""
    read = [s for s in samples if getattr(s, attr) > 0]
    if len(read) < 2:
        return None
    first = min(read, key=lambda s: abs(s.t_s - start_s))
    last = min(read, key=lambda s: abs(s.t_s - end_s))
    a, b = getattr(first, attr), getattr(last, attr)
    out = {"t0_s": first.t_s, "t1_s": last.t_s, "start_mb": round(a, 2), "end_mb": round(b, 2),
           "pct": round((b - a) / a * 100, 2)}
    window = [(s.t_s, float(getattr(s, attr))) for s in read if first.t_s <= s.t_s <= last.t_s]
    line = fitted_line(window)
    if line is not None:
        slope, at_start = line[0], line[0] * first.t_s + line[1]
        out["fit_pct"] = round(slope * (last.t_s - first.t_s) / at_start * 100, 2) if at_start > 0 else float("nan")
        out["fit_per_h"] = round(slope * 3600, 3)
    return out


def fitted_line(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(slope, intercept) of the least-squares line; None for fewer than 3 points or a single time."""
    if len(points) < 3 or len({t for t, _ in points}) < 2:
        return None
    line = statistics.linear_regression([t for t, _ in points], [v for _, v in points])
    return line.slope, line.intercept


def verdicts(run: ModeRun, specs: Sequence[BoundSpec]) -> list[BoundVerdict]:
    out = []
    for spec in specs:
        if spec.name == "admission_held":
            # the burst reads, and the 30-s samples (one may fall in a burst)
            reads = sorted([*run.burst_reads, *((f["t_s"], f["admission_held"], f["admission_full_outcomes"])
                                                for f in run.fills if "admission_held" in f)])
            peaks = [(t, held) for t, held, _ in reads]
            outcomes = [(t, n) for t, _, n in reads]
            out.append(judge_events(spec, peaks, outcomes))
        else:
            out.append(judge(spec, [(f["t_s"], f[spec.name]) for f in run.fills if spec.name in f]))
    late = new_after(run.series_first_seen, run.fills[-1]["t_s"] / 2) if run.fills else []
    shown = ", ".join(f"`{k}`" for k in late[:MAX_LATE_SHOWN]) + (f" and {len(late) - MAX_LATE_SHOWN} more"
                                                                  if len(late) > MAX_LATE_SHOWN else "")
    out.append(judge_plateau("metric_series", [(f["t_s"], f["metric_series_folded"]) for f in run.fills
                                               if "metric_series_folded" in f],
                             "label sets of /metrics, engine addresses and the code's closed sets ("
                             + ", ".join(CLOSED_LABELS) + ") folded (an engine that leaves and comes back adds none; "
                             "a failure reason first seen late adds a bounded set): no limit, must plateau; label "
                             "sets (engine addresses folded) first seen in the second half: "
                             + (shown or "none")))
    return out


def excused_404s(followups: Sequence[dict[str, Any]], churn: Sequence[dict[str, Any]]) -> int:
    """Follow-ups answered 404 because their holder left the fleet after it stored the response (or while it did:
    the parent was routed there up to PARENT_SLACK_S before it ended) and before the follow-up: the sidecar cannot
    route to an engine outside its fleet, and a non-holder's 404 is then the right answer."""
    leaves = [(c["t_s"], c["engine"]) for c in churn if c["action"] == "leave"]
    return sum(1 for f in followups if any(engine == f["parent_served_by"] and f["parent_t_s"] - PARENT_SLACK_S <= t
                                           <= f["t_s"] for t, engine in leaves))


# what a growth is made of, judged by nothing: Python's objects, native memory, and whose the anonymous pages are
PART_LABELS = {"malloc_mmapped_mb": "chunks above the mmap threshold (MiB)",
               "python_blocks": "Python's allocated blocks",
               "malloc_free_mb": "free inside malloc after its trim (MiB)",
               "glibc_arenas_mb": "resident in glibc's thread arenas (MiB)",
               "thread_stacks_mb": "resident in thread stacks (MiB)",
               "other_anon_mb": "resident in other anonymous maps: Python's arenas, mmapped chunks (MiB)"}


def mode_report(run: ModeRun, cfg: MixedConfig, specs: Sequence[BoundSpec], done: dict[str, Any]) -> dict[str, Any]:
    start, end = cfg.window_s
    traffic = done["traffic"]
    excused = excused_404s(traffic["followup_404"], run.churn_log)
    failed = traffic["failed"] + len(traffic["followup_404"]) - excused
    unexcused = [f for f in traffic["followup_404"] if not excused_404s([f], run.churn_log)]
    bounds = verdicts(run, specs)
    rss, malloc = growth_pct(run.samples, "rss_mb", start, end), growth_pct(run.samples, "malloc_in_use_mb", start, end)
    checks = {
        "rss_growth": rss is not None and rss["pct"] <= GROWTH_TARGET_PCT,
        "malloc_growth": malloc is not None and malloc["pct"] <= GROWTH_TARGET_PCT,
        "bounds_reached_and_held": all(b.reached and b.held for b in bounds),
        "no_failed_requests": failed == 0,
        "inflight_after_zero": done["after"].get("inflight_total") == 0,
    }
    # what the growth is made of: Python's objects, or native memory (not judged; older sidecars export neither)
    parts = {attr: growth_pct(run.samples, attr, start, end) for attr in PART_LABELS}
    return {"mode": run.mode, "prefix_sources": run.prefix_sources, "rss_growth": rss, "malloc_growth": malloc,
            "malloc_parts": parts,
            "bounds": [b.to_dict() for b in bounds], "failed": failed, "followup_404_excused": excused,
            "followup_404_unexcused": unexcused[:FAILURES_SHOWN], "traffic": traffic, "after": done["after"],
            "stream_ends": done["stream_ends"],
            "churn": run.churn_log, "session_probes": run.probes, "checks": checks, "passed": all(checks.values()),
            "samples": [s.__dict__ for s in run.samples], "fills": run.fills,
            "burst_reads": run.burst_reads}


def _fmt(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:g}"


def mode_markdown(r: dict[str, Any], window: tuple[float, float]) -> list[str]:
    t = r["traffic"]
    rss, malloc = r["rss_growth"], r["malloc_growth"]

    def growth(g: dict[str, float] | None) -> str:
        if g is None:
            return "not read"
        fit = (f"; fitted line over every sample {g['fit_pct']:+.2f}% ({g['fit_per_h']:+.2f} MiB an hour)"
               if "fit_pct" in g else "")
        return (f"**{g['pct']:+.2f}%** ({g['start_mb']:.1f} -> {g['end_mb']:.1f} MiB, "
                f"t={g['t0_s']:.0f}..{g['t1_s']:.0f} s{fit})")

    def part(g: dict[str, float] | None) -> str:
        return "not read" if g is None else f"{g['pct']:+.2f}% ({g['start_mb']:,.1f} -> {g['end_mb']:,.1f})"

    ok = sum(n for k, n in t["outcomes"].items() if k.endswith(":ok"))
    lines = [f"### {r['mode']} (prefix sources {r['prefix_sources']}): {'PASS' if r['passed'] else 'FAIL'}", "",
             "| figure | measured | target |", "|---|---|---|",
             f"| RSS growth t={window[0]:.0f}..{window[1]:.0f} s | {growth(rss)} | at most +1% |",
             f"| live malloc growth | {growth(malloc)} | at most +1% |",
             *(f"| of it: {label} | {part(r.get('malloc_parts', {}).get(attr))} | (not judged) |"
               for attr, label in PART_LABELS.items()),
             f"| bounds reached and held | {sum(1 for b in r['bounds'] if b['reached'] and b['held'])} of "
             f"{len(r['bounds'])} | all |",
             f"| failed requests | {r['failed']} (of {t['sent']} sent; {r['followup_404_excused']} follow-up 404s "
             f"excused: holder left the fleet) | 0 |",
             f"| in flight after the load | {r['after'].get('inflight_total')} (open streams "
             f"{r['after'].get('open_streams')}) | 0 |", "",
             f"Traffic: {t['scheduled']} scheduled, {ok} OK, {t['shed']} shed (429 + Retry-After), {t['hangups']} "
             f"hang-ups, {t['cancels']} cancels, {t['sessions']} sessions; ext_proc streams by end: "
             f"{json.dumps(r['stream_ends'], sort_keys=True)}", "",
             "| bound | limit | reached | at (s) | held | peak | last | dips | observed |",
             "|---|---:|---|---:|---|---:|---:|---:|---|"]
    for b in r["bounds"]:
        lines.append(f"| {b['name']} | {_fmt(b['limit'])} | {'yes' if b['reached'] else 'no'} | "
                     f"{_fmt(b['reached_at_s'])} | {'yes' if b['held'] else 'no'} | {_fmt(b['peak'])} | "
                     f"{_fmt(b['last'])} | {b['dips']} | {b['observed']}{'; ' + b['note'] if b['note'] else ''} |")
    if r.get("followup_404_unexcused"):
        lines += ["", "Follow-up 404s not excused (the parent's engine never left between them):", ""] + [
            f"- t={f['t_s']} s: parent served by {f['parent_served_by']} at t={f['parent_t_s']} s, 404 from "
            f"{f.get('answered_by', '?')}" for f in r["followup_404_unexcused"]]
    if t.get("failed_per_minute"):
        lines += ["", "Failures by minute of the run: " + ", ".join(
            f"{m}: {n}" for m, n in sorted(t["failed_per_minute"].items(), key=lambda kv: int(kv[0])))]
    if t["failures"]:
        lines += ["", "First failures:", ""] + [f"- t={f['t_s']} s {f['kind']} {f['outcome']} {f['detail'][:160]}"
                                               for f in t["failures"][:10]]
    lines += ["", "| t (s) | RSS (MiB) | [heap] | anonymous | of it glibc thread arenas | thread stacks | rest "
              "| live malloc | of it mmapped | malloc free | malloc from system | Python's blocks | CPU (s) |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {s['t_s']:.0f} | {s['rss_mb']:.1f} | {s['heap_mb']:.1f} | {s['anon_mb']:.1f} | "
              f"{s.get('glibc_arenas_mb', 0.0):.1f} | {s.get('thread_stacks_mb', 0.0):.1f} | "
              f"{s.get('other_anon_mb', 0.0):.1f} | {s['malloc_in_use_mb']:.1f} | "
              f"{s.get('malloc_mmapped_mb', 0.0):.1f} | {s.get('malloc_free_mb', 0.0):.1f} | "
              f"{s.get('malloc_system_mb', 0.0):.1f} | {s.get('python_blocks', 0.0):,.0f} | {s['cpu_s']:.0f} |"
              for s in r["samples"]]
    return lines


def markdown(report: dict[str, Any]) -> str:
    c = report["config"]
    bursts = {m: [round(a) for a, _ in b] for m, b in c["bursts"].items()}
    churn = [(round(a), round(b)) for a, b in c["churn"]]
    lines = [f"## Soak: {', '.join(report['modes'])} side by side, {c['duration_s']:.0f} s at {c['rate']:g} req/s each",
             "", f"Bounds (sized to fill within {c['fill_s']:.0f} s): {json.dumps(report['bounds'])}; bursts "
             f"(x{c['burst_factor']:g}, pool saturated) at {bursts} s; an engine out of the fleet at {churn} s.", ""]
    for r in report["modes"].values():
        lines += mode_markdown(r, tuple(c["window_s"])) + [""]
    return "\n".join(lines)
