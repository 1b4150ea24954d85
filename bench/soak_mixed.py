"""The mixed soak behind `python -m bench.soak`: hours of mixed traffic through real Envoy into the sidecar, in
two configurations side by side, every bound filled, RSS and live malloc sampled every 30 s.

    buffered-kv    envoy/envoy.yaml (ext_proc BUFFERED), engines publishing KV events, --prefix-source
                   kv-events,approx (as `make bench BENCH_ARGS="--cases soak"`, so the figures compare)
    picker-approx  envoy/envoy-inference-pool.yaml (the InferencePool endpoint picker: FULL_DUPLEX_STREAMED, the
                   response crosses the sidecar), --prefix-source approx

Both run at once, each with its own engines (own loopback base address), sidecar, Envoy and traffic process on
private ports: the second hour is the same hour for both, and a soak of two hours takes two. Neither holds the
machine-wide loopback lock. Each sidecar runs with --session-header, --admission on with objectives, and
bounds sized to fill early (bench/soak_bounds.py). The traffic is bench/soak_traffic.py's mix. On top:

- bursts: every `burst_every_s` the traffic runs at `burst_factor` times its rate for `burst_s`, and every
  engine reports phantom queued requests (POST /sim/phantom_load), so the pool is saturated and admission holds
  requests (and sheds sheddable ones past its bounds: 429 with Retry-After);
- churn: every `churn_every_s` one engine leaves the sidecar's fleet (its --endpoints-file rewritten) for
  `churn_out_s`, then comes back; the next churn takes the next engine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testkit.envoy import EnvoyProc
from testkit.fleet import FleetProc
from testkit.metrics_text import metric_sum
from testkit.paths import REPO, TINY_TOKENIZER, repo_env
from testkit.ports import free_port
from testkit.procs import cpu_seconds
from testkit.profiled import memray_sidecar
from testkit.sidecar import SidecarProc

from .soak import SOAK_FLEET, Sample, kv_lag_s, mapping_mb, private_envoy_config, read_malloc, read_mappings, rss_mb
from .soak_bounds import (
    CLOSED_LABELS,
    ENDPOINT_LABELS,
    Bounds,
    bound_specs,
    folded_series,
    held_full_outcomes,
    note_first_seen,
    read_fills,
    size_bounds,
)
from .soak_traffic import SESSION_HEADER, TrafficSpec

log = logging.getLogger("bench.soak")

MODES = ("buffered-kv", "picker-approx")
PICKER_CONFIG = REPO / "envoy" / "envoy-inference-pool.yaml"
PREFIX_SOURCES = {"buffered-kv": "kv-events,approx", "picker-approx": "approx"}
BASE_IPS = {"buffered-kv": "127.0.77.2", "picker-approx": "127.0.78.2"}  # not the shipped 127.0.0.2-4
OBJECTIVES = {"critical": {"priority": 10}, "standard": {"priority": 0}, "batch": {"priority": -1}}
PHANTOM_BURST = {"running": 8, "waiting": 32}  # every engine queues: the pool is saturated
PHANTOM_OFF = {"running": 0, "waiting": 0}
SESSION_TTL_S = 7200.0  # longer than the soak: only the entry bound forgets a session


@dataclass
class MixedConfig:
    out_dir: Path
    duration_s: float = 7200.0
    rate: float = 40.0  # per mode
    modes: tuple[str, ...] = MODES
    sample_s: float = 30.0
    churn_every_s: float = 240.0
    churn_out_s: float = 60.0
    burst_every_s: float = 300.0
    burst_s: float = 15.0
    burst_factor: float = 3.0
    admission_ttl_s: float = 5.0
    hangup_fraction: float = 0.05
    seed: int = 1
    tracemalloc_interval_s: float = 0.0
    glibc_tunables: str = ""  # GLIBC_TUNABLES for the sidecars ("": glibc's defaults)
    memray_dir: str = ""  # each sidecar under memray, recording to DIR/MODE.bin ("": not)
    sidecar_extra: tuple[str, ...] = ()  # more sidecar flags (bench.stall: --max-open-streams)

    @property
    def fill_s(self) -> float:
        """Every bound is sized to fill within this: the first 10 minutes, or the first quarter of a short run."""
        return min(600.0, self.duration_s / 4)

    @property
    def window_s(self) -> tuple[float, float]:
        """The growth window: the second hour of two, the second half of any run."""
        return self.duration_s / 2, self.duration_s

    def bursts(self, mode: int = 0) -> list[tuple[float, float]]:
        """(start, end) of each burst of the `mode`-th configuration. The second one's bursts fall halfway
        between the first one's: two at once overloaded the simulated engines of a 2-core machine (Envoy's 1 s
        connect timeout to them lapsed: 503s that say nothing about the sidecar)."""
        first = min(self.burst_every_s, self.duration_s / 3) + mode * self.burst_every_s / 2
        out, t = [], first
        while t + self.burst_s < self.duration_s - 10:
            out.append((t, t + self.burst_s))
            t += self.burst_every_s
        return out

    def churn(self) -> list[tuple[float, float]]:
        """(leaves at, back at) of each churn, the engine back before the load ends."""
        out, t = [], self.churn_every_s
        while t + self.churn_out_s < self.duration_s - 10:
            out.append((t, t + self.churn_out_s))
            t += self.churn_every_s
        return out


def picker_envoy_config(fleet: list[str], listen: int, admin: int, sidecar: int, out: Path) -> Path:
    """envoy/envoy-inference-pool.yaml with only its ports and its engines cluster's hosts rewritten."""
    config: dict[str, Any] = yaml.safe_load(PICKER_CONFIG.read_text())
    config["admin"]["address"]["socket_address"]["port_value"] = admin
    config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] = listen
    for cluster in config["static_resources"]["clusters"]:
        hosts = {"engines": fleet, "loadaware": [f"127.0.0.1:{sidecar}"]}.get(cluster["name"])
        if hosts is not None:
            cluster["load_assignment"]["endpoints"] = [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": h.rpartition(":")[0],
                                                             "port_value": int(h.rpartition(":")[2])}}}}
                for h in hosts]}]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out


@dataclass
class ModeRun:
    """One configuration's stack, its traffic process and what was read from it."""

    mode: str
    out_dir: Path
    bounds: Bounds
    fleet: FleetProc
    sidecar: SidecarProc
    envoy: EnvoyProc
    endpoints_file: Path
    loader: subprocess.Popen[str] | None = None
    samples: list[Sample] = field(default_factory=list)
    fills: list[dict[str, float]] = field(default_factory=list)  # per sample, with "t_s"
    burst_reads: list[tuple[float, float, float]] = field(default_factory=list)  # (t, held, full outcomes)
    probes: list[dict[str, Any]] = field(default_factory=list)
    churn_log: list[dict[str, Any]] = field(default_factory=list)
    probe_count: int = 0
    series_first_seen: dict[str, float] = field(default_factory=dict)  # folded /metrics label sets (soak_bounds.py)

    @property
    def prefix_sources(self) -> str:
        return PREFIX_SOURCES[self.mode]

    def set_fleet(self, endpoints: list[str]) -> None:
        write_fleet(self.endpoints_file, endpoints)

    def phantom(self, load: dict[str, int]) -> None:
        for ep in self.fleet.endpoints:
            with contextlib.suppress(OSError):
                req = urllib.request.Request(f"http://{ep}/sim/phantom_load", method="POST",
                                             data=json.dumps(load).encode(),
                                             headers={"Content-Type": "application/json"})
                urllib.request.urlopen(req, timeout=5).close()


def write_fleet(path: Path, endpoints: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(endpoints) + "\n")
    tmp.replace(path)  # one rename: the sidecar never reads half a file


def sidecar_args(mode: str, cfg: MixedConfig, bounds: Bounds, fleet: FleetProc, endpoints_file: Path,
                 objectives: Path) -> list[str]:
    sources = PREFIX_SOURCES[mode]
    args = ["--listen", f"127.0.0.1:{free_port()}", "--endpoints-file", str(endpoints_file),
            "--tokenizer", str(TINY_TOKENIZER), "--metrics-listen", f"127.0.0.1:{free_port()}",
            "--log-level", "warning", "--prefix-source", sources,
            "--session-header", SESSION_HEADER, "--session-ttl-s", f"{SESSION_TTL_S:g}",
            "--admission", "on", "--objectives", str(objectives), "--admission-ttl-s", f"{cfg.admission_ttl_s:g}",
            *bounds.sidecar_args(sources)]
    if "kv-events" in sources:
        args += ["--kv-events-endpoints", ",".join(
            f"{e['ip']}:{e['port']}={e['ip']}:{e['kv_events_port']}/{e['kv_events_replay_port']}"
            for e in fleet.engines)]
    if cfg.tracemalloc_interval_s > 0:
        args += ["--tracemalloc-dir", str(cfg.out_dir / mode / "tracemalloc"),
                 "--tracemalloc-interval-s", f"{cfg.tracemalloc_interval_s:g}"]
    return [*args, *cfg.sidecar_extra]


@contextlib.contextmanager
def mode_stack(mode: str, cfg: MixedConfig, bounds: Bounds) -> Iterator[ModeRun]:
    out = cfg.out_dir / mode
    logs = out / "logs"
    with contextlib.ExitStack() as stack:
        kv = ["--kv-events", "--kv-events-port", "0", "--kv-events-replay-port", "0"] \
            if "kv-events" in PREFIX_SOURCES[mode] else []
        fleet = stack.enter_context(FleetProc(logs, engines=3, base_ip=BASE_IPS[mode], port=free_port(),
                                              extra_args=[*SOAK_FLEET, *kv]))
        endpoints_file, objectives = out / "endpoints.txt", out / "objectives.json"
        objectives.write_text(json.dumps(OBJECTIVES))
        write_fleet(endpoints_file, fleet.endpoints)
        sidecar = stack.enter_context(SidecarProc(
            sidecar_args(mode, cfg, bounds, fleet, endpoints_file, objectives), log_dir=logs,
            env={"GLIBC_TUNABLES": cfg.glibc_tunables} if cfg.glibc_tunables else None,
            command=memray_sidecar(Path(cfg.memray_dir) / f"{mode}.bin") if cfg.memray_dir else None))
        sidecar_port = int(sidecar.listen.rpartition(":")[2])
        listen, admin = free_port(), free_port()
        if mode == "buffered-kv":
            config = private_envoy_config(fleet.endpoints, listen, admin, sidecar_port, logs / "envoy-soak.yaml")
        else:
            config = picker_envoy_config(fleet.endpoints, listen, admin, sidecar_port, logs / "envoy-picker.yaml")
        envoy = stack.enter_context(EnvoyProc(config, logs))
        yield ModeRun(mode, out, bounds, fleet, sidecar, envoy, endpoints_file)


def start_traffic(run: ModeRun, cfg: MixedConfig) -> None:
    spec = TrafficSpec(url=run.envoy.url, rate=cfg.rate, duration_s=cfg.duration_s, seed=cfg.seed,
                       hangup_fraction=cfg.hangup_fraction, bursts=cfg.bursts(cfg.modes.index(run.mode)),
                       burst_factor=cfg.burst_factor,
                       timeout_s=max(60.0, cfg.admission_ttl_s * 4),
                       followup_window=max(10, run.bounds.state_max_entries // 4),
                       progress_file=str(run.out_dir / "traffic.progress.json"))
    spec_path = run.out_dir / "traffic.spec.json"
    spec_path.write_text(json.dumps(asdict(spec)))
    (run.out_dir / "traffic.result.json").unlink(missing_ok=True)
    run.loader = subprocess.Popen([sys.executable, "-m", "bench.soak_traffic", str(spec_path),
                                   str(run.out_dir / "traffic.result.json")],
                                  cwd=REPO, env=repo_env(), stderr=subprocess.PIPE, text=True)


def bounds_for(cfg: MixedConfig) -> Bounds:
    spec = TrafficSpec(url="", rate=cfg.rate, duration_s=cfg.duration_s)
    return size_bounds(cfg.rate, cfg.fill_s, spec.mix, spec.session_share, spec.chat_turns,
                       cfg.rate * cfg.burst_factor, cfg.admission_ttl_s)


def in_burst(cfg: MixedConfig, mode: int, t: float) -> bool:
    """Within a burst of the `mode`-th configuration or the admission TTL after it (held requests still out)."""
    return any(a <= t <= b + 2 * cfg.admission_ttl_s for a, b in cfg.bursts(mode))


def sample(run: ModeRun, cfg: MixedConfig, t_s: float) -> None:
    pid = run.sidecar.pid
    s = Sample(round(t_s, 1), rss_mb(pid), cpu_seconds(pid), *mapping_mb(pid))
    read_mappings(s, pid)
    fills: dict[str, float] = {"t_s": s.t_s}
    try:
        text = run.sidecar.metrics_text(timeout=10.0)
        read_malloc(s, text)
        s.kv_lag_s = kv_lag_s(text)
        state = run.sidecar.debug_json("/debug/state", timeout=10.0)
        decisions = run.sidecar.debug_json("/debug/decisions?n=100000", timeout=10.0)
        fills.update(read_fills(state, text, len(decisions)))
        keys = folded_series(text)
        fills["metric_series_folded"] = float(len(folded_series(text, (*ENDPOINT_LABELS, *CLOSED_LABELS))))
        note_first_seen(run.series_first_seen, keys, s.t_s)
    except Exception as exc:  # noqa: BLE001 - a missed read is a gap in the record, not the end of the soak
        log.warning("%s: reading the sidecar at t=%.0f s failed: %s", run.mode, t_s, exc)
    if in_burst(cfg, cfg.modes.index(run.mode), t_s) and run.fills:
        # admission holds (and sheds) the probes during a burst: the last reading stands
        fills["session_map"] = run.fills[-1].get("session_map", 0.0)
    else:
        fills["session_map"] = probe_sessions(run, t_s)
    run.samples.append(s)
    run.fills.append(fills)
    log.info("%s t=%5.0fs RSS %.1f MiB (malloc in use %.1f) %s", run.mode, s.t_s, s.rss_mb, s.malloc_in_use_mb,
             " ".join(f"{k}={v:g}" for k, v in fills.items() if k != "t_s"))


def probe_sessions(run: ModeRun, t_s: float) -> float:
    """The session map's fill as the probes show it: the limit when a session about limit/2 back is still bound
    and one 2 x limit back is forgotten (so the map holds between limit/2 and 2 x limit sessions, an LRU past its
    bound); 0 while fewer than 2 x limit sessions have been started or the probes disagree. Two sessions are
    tried inside: one may never have been bound (its only request shed by admission or hung up early)."""
    limit = run.bounds.session_max_entries
    try:
        started = int(json.loads((run.out_dir / "traffic.progress.json").read_text())["sessions"])
    except (OSError, ValueError, KeyError):
        return 0.0
    if started < 2 * limit + 1:
        return 0.0
    inside = [probe_one(run, f"s{started - limit // 2 - k}") for k in range(2)]
    beyond = probe_one(run, f"s{started - 2 * limit}")
    run.probes.append({"t_s": round(t_s, 1), "sessions": started, "inside": inside, "beyond": beyond})
    return float(limit) if any(a in ("kept", "moved") for a in inside) and beyond == "new" else 0.0


def probe_one(run: ModeRun, session: str) -> str:
    """What affinity did for one request of `session` (its decision found by its x-request-id)."""
    run.probe_count += 1
    request_id = f"soak-probe-{run.mode}-{run.probe_count}"
    body = json.dumps({"model": "tiny-model", "prompt": f"probe {request_id}", "max_tokens": 1}).encode()
    req = urllib.request.Request(f"{run.envoy.url}/v1/completions", data=body, method="POST",
                                 headers={"content-type": "application/json", SESSION_HEADER: session,
                                          "x-request-id": request_id,
                                          "x-gateway-inference-objective": "critical"})
    try:
        urllib.request.urlopen(req, timeout=30).close()
        for d in run.sidecar.debug_json("/debug/decisions?n=256", timeout=10.0):
            if d.get("request_id") == request_id:
                return str(d.get("affinity", ""))
    except Exception as exc:  # noqa: BLE001 - a failed probe reads as "unknown", and the bound as not shown
        return f"error:{type(exc).__name__}"
    return "not_found"


# ---------------------------------------------------------------------------------------------------------
# the run: bursts, churn and samples on one clock (the traffic's), then the drain
# ---------------------------------------------------------------------------------------------------------

class Clock:
    """Seconds since the first traffic process's first arrival (read from its progress file), so that bursts,
    churn and samples line up with the traffic's own schedule whatever its start-up took."""

    def __init__(self, run: ModeRun, wait_s: float = 120.0) -> None:
        deadline = time.monotonic() + wait_s
        path = run.out_dir / "traffic.progress.json"
        while True:
            with contextlib.suppress(OSError, ValueError, KeyError):
                t = float(json.loads(path.read_text())["t_s"])
                self.t0 = time.monotonic() - t
                return
            if time.monotonic() > deadline or (run.loader is not None and run.loader.poll() is not None):
                raise RuntimeError(f"{run.mode}: the traffic process did not start: {stderr_of(run)}")
            time.sleep(0.1)

    def now(self) -> float:
        return time.monotonic() - self.t0


def stderr_of(run: ModeRun) -> str:
    if run.loader is None or run.loader.poll() is None or run.loader.stderr is None:
        return ""
    return run.loader.stderr.read()[-3000:]


@dataclass
class Timeline:
    """What is due when: (t, action, argument), in order."""

    events: list[tuple[float, str, int]]

    @classmethod
    def of(cls, cfg: MixedConfig) -> Timeline:
        events = [(t, action, k) for k in range(len(cfg.modes)) for a, b in cfg.bursts(k)
                  for t, action in ((a, "burst_on"), (b, "burst_off"))]
        for k, (leave, back) in enumerate(cfg.churn()):
            events += [(leave, "leave", k % 3), (back, "back", k % 3)]
        return cls(sorted(events))

    def due(self, t: float) -> list[tuple[float, str, int]]:
        out = [e for e in self.events if e[0] <= t]
        self.events = self.events[len(out):]
        return out


def act(runs: list[ModeRun], t: float, action: str, arg: int) -> None:
    """A burst's start or end for the `arg`-th configuration; an engine (the `arg`-th) leaving or back for all."""
    for k, run in enumerate(runs):
        if action in ("burst_on", "burst_off"):
            if k == arg:
                run.phantom(PHANTOM_BURST if action == "burst_on" else PHANTOM_OFF)
                log.info("%s t=%.0fs %s", run.mode, t, action)
        else:
            engine = arg
            name = run.fleet.engines[engine]["name"]
            gone = run.fleet.endpoints[engine]
            run.set_fleet([ep for ep in run.fleet.endpoints if action == "back" or ep != gone])
            run.churn_log.append({"t_s": round(t, 1), "action": action, "engine": name, "endpoint": gone})
            log.info("%s t=%.0fs %s %s", run.mode, t, action, name)


def read_admission(run: ModeRun, t: float) -> None:
    """During a burst: the held count and the bound's refusals, every couple of seconds (a 30-s sample would
    miss the peak)."""
    with contextlib.suppress(Exception):
        text = run.sidecar.metrics_text(timeout=5.0)
        run.burst_reads.append((round(t, 1), metric_sum(text, "loadaware_flow_control_queue_size"),
                                held_full_outcomes(text)))


def drive(runs: list[ModeRun], cfg: MixedConfig) -> Clock:
    clock = Clock(runs[0])
    timeline = Timeline.of(cfg)
    next_sample = next_admission = 0.0
    while any(r.loader is not None and r.loader.poll() is None for r in runs):
        t = clock.now()
        for at, action, engine in timeline.due(t):
            act(runs, at, action, engine)
        if t >= next_admission:
            for k, run in enumerate(runs):
                if in_burst(cfg, k, t):
                    read_admission(run, t)
            next_admission = t + 2.0
        if t >= next_sample and t <= cfg.duration_s + 1:
            for run in runs:
                sample(run, cfg, t)
            next_sample += cfg.sample_s
        time.sleep(0.25)
    for at, action, engine in timeline.due(float("inf")):  # a fleet left mid-churn is made whole again
        if action in ("back", "burst_off"):
            act(runs, at, action, engine)
    return clock


def drained(run: ModeRun, wait_s: float = 30.0) -> dict[str, Any]:
    """In flight and open streams once the load stopped, waiting up to `wait_s` for them to reach 0."""
    deadline = time.monotonic() + wait_s
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            state = run.sidecar.debug_json("/debug/state", timeout=10.0)
            if state.get("inflight_total") == 0 and state.get("open_streams") == 0:
                break
        time.sleep(1.0)
    return {"inflight_total": state.get("inflight_total"), "open_streams": state.get("open_streams")}


def finish(run: ModeRun) -> dict[str, Any]:
    """After the traffic: its result, the drain, how the streams ended."""
    assert run.loader is not None
    run.loader.wait()
    result_path = run.out_dir / "traffic.result.json"
    if run.loader.returncode != 0 or not result_path.exists():
        raise RuntimeError(f"{run.mode}: the traffic process failed (rc={run.loader.returncode}): {stderr_of(run)}")
    after = drained(run)
    ends: dict[str, float] = {}
    with contextlib.suppress(Exception):
        text = run.sidecar.metrics_text(timeout=10.0)
        ends = {line.split('end="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line.startswith("loadaware_extproc_streams_total{")}
    return {"traffic": json.loads(result_path.read_text()), "after": after, "stream_ends": ends}


def run_mixed(cfg: MixedConfig) -> dict[str, Any]:
    """Both configurations side by side; the report (bench/soak_report.py) of each."""
    from .soak_report import mode_report

    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    bounds = bounds_for(cfg)
    log.info("soak: %s for %.0f s at %g req/s each; bounds %s", ",".join(cfg.modes), cfg.duration_s, cfg.rate,
             asdict(bounds))
    with contextlib.ExitStack() as stack:
        runs = [stack.enter_context(mode_stack(m, cfg, bounds)) for m in cfg.modes]
        try:
            for run in runs:
                start_traffic(run, cfg)
            drive(runs, cfg)
            finished = [finish(run) for run in runs]
        finally:
            for run in runs:
                if run.loader is not None and run.loader.poll() is None:
                    run.loader.kill()
        reports = {run.mode: mode_report(run, cfg, bound_specs(bounds, run.prefix_sources), done)
                   for run, done in zip(runs, finished)}
    return {"config": {**{k: v for k, v in asdict(cfg).items() if k != "out_dir"}, "out_dir": str(cfg.out_dir),
                       "fill_s": cfg.fill_s, "window_s": cfg.window_s,
                       "bursts": {m: cfg.bursts(k) for k, m in enumerate(cfg.modes)}, "churn": cfg.churn()},
            "bounds": asdict(bounds), "modes": reports}
