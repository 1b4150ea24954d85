"""One measured arm: CPU of every server process and the sidecar's stage histograms, bracketed around a
load-generator run in its own process."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testkit.paths import REPO, repo_env
from testkit.procs import ManagedProc
from testkit.sidecar import SidecarProc

from . import promtext
from .loadgen import LoadResult, LoadSpec
from .stats import latency_summary_ms

STAGES = ("parse", "tokenize", "lookup", "score")


def run_loadgen(spec: LoadSpec, work_dir: Path, tag: str) -> LoadResult:
    """Run the generator in a fresh process (never on a server's event loop); raise with its stderr."""
    work_dir.mkdir(parents=True, exist_ok=True)
    tag = re.sub(r"[^A-Za-z0-9_.+-]", "_", tag)
    spec_path = work_dir / f"{tag}.spec.json"
    out_path = work_dir / f"{tag}.result.json"
    spec_path.write_text(json.dumps(asdict(spec)))
    out_path.unlink(missing_ok=True)
    budget = spec.duration + spec.drain_timeout + 30.0
    proc = subprocess.run([sys.executable, "-m", "bench.loadgen", str(spec_path), str(out_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=budget, env=repo_env())
    if proc.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"load generator failed (rc={proc.returncode}):\n{proc.stderr[-3000:]}")
    return LoadResult.from_dict(json.loads(out_path.read_text()))


@dataclass
class ArmResult:
    case: str
    arm: str
    rate: float
    requests: int
    ok: int
    errors: int
    statuses: dict[str, int]
    achieved_rate: float
    send_lag_p99_ms: float
    latency: dict[str, float]  # p50_ms, p90_ms, p99_ms, max_ms, mean_ms
    cpu_s: dict[str, float]  # per process over the window
    cpu_us_per_request: dict[str, float]
    cpu_per_wall_s: dict[str, float]  # 1.0 = one core busy
    wall_s: float
    stages_us: dict[str, float] = field(default_factory=dict)  # mean per stage, from the sidecar histograms
    decision_us: float = math.nan
    decisions: float = 0.0
    lookups: dict[str, float] = field(default_factory=dict)  # match / empty / failed deltas
    fallbacks: float = 0.0
    ttft: dict[str, float] = field(default_factory=dict)  # streamed responses: like `latency`, to 1st event
    sse_events: dict[str, int] = field(default_factory=dict)  # streamed: {events per response: responses}
    counters: dict[str, float] = field(default_factory=dict)  # Δ of the caller's counters (Envoy's ext_proc)

    @property
    def sse_events_per_response(self) -> float:
        n = sum(self.sse_events.values())
        return sum(int(k) * v for k, v in self.sse_events.items()) / n if n else math.nan

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def machine_busy_seconds(stat_text: str, ticks_per_s: float) -> float:
    """CPU seconds all cores together spent busy since boot (user, nice, system, irq, softirq; not idle,
    iowait or steal), from the aggregate `cpu` line of /proc/stat."""
    for line in stat_text.splitlines():
        if line.startswith("cpu "):
            f = [int(x) for x in line.split()[1:]]
            return (f[0] + f[1] + f[2] + f[5] + f[6]) / ticks_per_s
    raise ValueError("no aggregate cpu line in /proc/stat")


def _machine_busy() -> float | None:
    try:
        return machine_busy_seconds(Path("/proc/stat").read_text(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _safe_metrics(sidecar: SidecarProc | None) -> str:
    if sidecar is None or not sidecar.running:
        return ""
    try:
        return sidecar.metrics_text()
    except Exception:  # noqa: BLE001 - metrics are a bonus; a failed scrape must not lose the run
        return ""


def measure(case: str, arm: str, spec: LoadSpec, procs: dict[str, ManagedProc], work_dir: Path,
            sidecar: SidecarProc | None = None, warmup_s: float = 0.0,
            counters: Callable[[], dict[str, float]] | None = None) -> ArmResult:
    """Optional warm-up run, then the measured run with CPU and metrics snapshots around it. `counters`
    (read outside the CPU window) gives named counters whose deltas over the run go into the result."""
    if warmup_s > 0:
        warm = LoadSpec(**{**asdict(spec), "duration": warmup_s, "seed": spec.seed + 1000})
        run_loadgen(warm, work_dir, f"{case}-{arm}-warm")
    c0 = counters() if counters is not None else {}
    busy0 = _machine_busy()
    cpu0 = {name: p.cpu_seconds() for name, p in procs.items() if p.running}
    m0 = _safe_metrics(sidecar)
    t0 = time.monotonic()
    result = run_loadgen(spec, work_dir, f"{case}-{arm}")
    wall = time.monotonic() - t0
    cpu1 = {name: p.cpu_seconds() for name, p in procs.items() if p.running}
    busy1 = _machine_busy()
    m1 = _safe_metrics(sidecar)
    c1 = counters() if counters is not None else {}
    cpu = {name: cpu1[name] - cpu0[name] for name in cpu0 if name in cpu1}
    cpu["loadgen"] = result.client_cpu_s
    if busy0 is not None and busy1 is not None:
        # Everything else this machine ran meanwhile (other test runs, the load generator's start-up): a
        # benchmark sharing its cores with them measures them too.
        cpu["outside"] = (busy1 - busy0) - sum(cpu.values())
    n = max(1, result.sent)
    window = max(result.wall_s, spec.duration)
    out = ArmResult(
        case=case, arm=arm, rate=spec.rate, requests=result.sent, ok=result.ok, errors=result.errors,
        statuses=result.statuses, achieved_rate=result.achieved_rate, send_lag_p99_ms=result.send_lag_p99_ms,
        latency=latency_summary_ms(result.latencies_s), cpu_s=cpu,
        cpu_us_per_request={k: v / n * 1e6 for k, v in cpu.items()},
        # Δcpu covers the loadgen process start/stop too (servers idle then): divide by the process wall.
        cpu_per_wall_s={k: v / max(wall, window) for k, v in cpu.items()},
        wall_s=window,
        ttft=latency_summary_ms(result.ttft_s) if result.ttft_s else {},
        sse_events=result.sse_events,
        counters={k: v - c0.get(k, 0.0) for k, v in c1.items()},
    )
    if m0 and m1:
        stages = promtext.histogram_delta_means(m0, m1, "loadaware_decision_stage_seconds", by="stage")
        out.stages_us = {s: stages[s]["mean_s"] * 1e6 for s in STAGES if s in stages and stages[s]["count"] > 0}
        total = promtext.histogram_delta_means(m0, m1, "loadaware_decision_seconds").get("")
        if total is not None and total["count"] > 0:
            out.decision_us = total["mean_s"] * 1e6
            out.decisions = total["count"]
        out.lookups = {r: promtext.counter_delta(m0, m1, "loadaware_prefix_lookups", {"result": r})
                       for r in ("match", "empty", "failed")}
        out.fallbacks = promtext.counter_delta(m0, m1, "loadaware_fallbacks")
    return out
