"""Every engine stops answering for a while mid-traffic: what the sidecar holds meanwhile, and keeps after.

    python -m bench.stall [--mode buffered-kv|picker-approx] [--stall-at 60] [--stall-s 12] [--stalls 2]
        [--gap-s 90] [--rate 40] [--max-open-streams N] [--out DIR]

The soak's stack for one configuration (bench/soak_mixed.py: simulated engines, real Envoy, the sidecar with the
soak's bounds, its mixed traffic; no bursts or churn here). At `--stall-at` seconds every engine hangs (its
`/sim/fault` `hang`: requests, scrapes and health probes wait, its KV-event socket stays up) for `--stall-s`
seconds, then heals; `--stalls` times, `--gap-s` apart. Requests sent meanwhile stay in flight at the engines,
the sidecar's streams with them: the pile the two-hour soak met once (all engines ejected as unreachable for
2-14 s, docs/results.md), made on purpose and in minutes.

Every 2 s it reads the sidecar's RSS, its malloc heap ([heap]), glibc's thread arenas and the rest of its
anonymous pages (Python's arenas; bench/soak.py, `anon_parts`), and its requests in flight. The report: each
figure just before each stall, at its peak during or right after it, and settled (the median of the last
`SETTLE_SAMPLES` readings before the next stall or the end). A second stall that settles where the first did
says the pile's pages are reused (a plateau at the largest pile); one that settles higher says they are not.
`--max-open-streams N` runs the sidecar with that cap (its default otherwise): past it a new request gets 503 at
once, and the report counts them (`loadaware_decisions_total{outcome="overloaded"}`).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from testkit.http import post_json
from testkit.metrics_text import metric_sum

from .soak import anon_parts, mapping_mb, rss_mb
from .soak_mixed import MODES, MixedConfig, ModeRun, bounds_for, mode_stack, start_traffic

log = logging.getLogger("bench.stall")

SAMPLE_S = 2.0
SETTLE_SAMPLES = 10
FIGURES = ("rss_mb", "heap_mb", "thread_arenas_mb", "rest_mb", "inflight")


@dataclass
class Reading:
    t_s: float
    rss_mb: float
    heap_mb: float
    thread_arenas_mb: float
    rest_mb: float
    inflight: float


def read(run: ModeRun, t_s: float) -> Reading:
    pid = run.sidecar.pid
    arenas, _, rest = anon_parts(pid)
    try:
        inflight = float(run.sidecar.debug_json("/debug/state", timeout=5.0).get("inflight_total") or 0)
    except Exception:  # noqa: BLE001 - a stalled read is a gap in one figure, not the end of the run
        inflight = float("nan")
    return Reading(round(t_s, 1), rss_mb(pid), mapping_mb(pid)[0], arenas, rest, inflight)


def set_fleet_fault(run: ModeRun, mode: str) -> None:
    for endpoint in run.fleet.endpoints:
        post_json(f"http://{endpoint}/sim/fault", {"mode": mode, "status": 500})


def stall_windows(stall_at: float, stall_s: float, stalls: int, gap_s: float) -> list[tuple[float, float]]:
    return [(stall_at + k * (stall_s + gap_s), stall_at + k * (stall_s + gap_s) + stall_s) for k in range(stalls)]


def summarize(readings: Sequence[Reading], windows: Sequence[tuple[float, float]]) -> list[dict[str, Any]]:
    """Per stall: each figure just before it, its peak from its start to the next stall (or the end), and
    settled (the median of the last SETTLE_SAMPLES readings before the next stall or the end)."""
    out = []
    for k, (start, _end) in enumerate(windows):
        upto = windows[k + 1][0] if k + 1 < len(windows) else float("inf")
        before = [r for r in readings if r.t_s < start]
        after = [r for r in readings if start <= r.t_s < upto]
        if not before or not after:
            continue
        settled = after[-SETTLE_SAMPLES:]
        row: dict[str, Any] = {"stall": k + 1, "start_s": start}
        for name in FIGURES:
            row[name] = {"before": getattr(before[-1], name),
                         "peak": max(getattr(r, name) for r in after),
                         "settled": statistics.median(getattr(r, name) for r in settled)}
        out.append(row)
    return out


def markdown(rows: Sequence[dict[str, Any]], cfg: dict[str, Any]) -> str:
    cap = "" if cfg.get("max_open_streams") is None else \
        f"; --max-open-streams {cfg['max_open_streams']}: {cfg.get('overloaded', 0):.0f} requests refused with 503"
    lines = [f"Every engine hung for {cfg['stall_s']:g} s at {', '.join(f'{s:g}' for s, _ in cfg['windows'])} s "
             f"({cfg['mode']}, {cfg['rate']:g} req/s{cap}):", "",
             "| stall | figure | before | peak | settled | settled - before |", "|---|---|---:|---:|---:|---:|"]
    for row in rows:
        for name in FIGURES:
            f = row[name]
            lines.append(f"| {row['stall']} | {name} | {f['before']:.1f} | {f['peak']:.1f} | {f['settled']:.1f} | "
                         f"{f['settled'] - f['before']:+.1f} |")
    return "\n".join(lines)


def overloaded(run: ModeRun) -> float:
    """Requests the sidecar refused past --max-open-streams, from its /metrics."""
    return metric_sum(run.sidecar.metrics_text(timeout=5.0), "loadaware_decisions_total", {"outcome": "overloaded"})


def run(mode: str, out: Path, rate: float, windows: Sequence[tuple[float, float]], tail_s: float,
        sidecar_extra: Sequence[str] = ()) -> tuple[list[Reading], float]:
    duration = windows[-1][1] + tail_s
    cfg = MixedConfig(out_dir=out, duration_s=duration, rate=rate, modes=(mode,), burst_every_s=10 * duration,
                      churn_every_s=10 * duration, sidecar_extra=tuple(sidecar_extra))
    readings: list[Reading] = []
    with mode_stack(mode, cfg, bounds_for(cfg)) as stack:
        start_traffic(stack, cfg)
        t0 = time.monotonic()
        pending = [(at, "hang") for at, _ in windows] + [(end, "none") for _, end in windows]
        pending.sort()
        try:
            while (t := time.monotonic() - t0) < duration:
                while pending and pending[0][0] <= t:
                    _, fault = pending.pop(0)
                    set_fleet_fault(stack, fault)
                    log.info("t=%.1f s: every engine %s", t, "hangs" if fault == "hang" else "heals")
                readings.append(read(stack, t))
                time.sleep(SAMPLE_S)
        finally:
            set_fleet_fault(stack, "none")
        if stack.loader is not None:
            stack.loader.communicate(timeout=120)  # its stderr is a pipe: read, not left to fill
        refused = overloaded(stack)
    return readings, refused


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=MODES, default="buffered-kv")
    p.add_argument("--stall-at", type=float, default=60.0)
    p.add_argument("--stall-s", type=float, default=12.0)
    p.add_argument("--stalls", type=int, default=2)
    p.add_argument("--gap-s", type=float, default=90.0)
    p.add_argument("--rate", type=float, default=40.0)
    p.add_argument("--max-open-streams", type=int, default=None)
    p.add_argument("--out", default="out/stall")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    windows = stall_windows(args.stall_at, args.stall_s, max(1, args.stalls), args.gap_s)
    out = Path(args.out)
    extra = [] if args.max_open_streams is None else ["--max-open-streams", str(args.max_open_streams)]
    readings, refused = run(args.mode, out, args.rate, windows, tail_s=args.gap_s, sidecar_extra=extra)
    rows = summarize(readings, windows)
    cfg = {"mode": args.mode, "rate": args.rate, "stall_s": args.stall_s, "windows": windows,
           "max_open_streams": args.max_open_streams, "overloaded": refused}
    (out / "stall.json").write_text(json.dumps({"config": cfg, "summary": rows,
                                                "readings": [asdict(r) for r in readings]}, indent=1))
    text = markdown(rows, cfg)
    (out / "stall.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
