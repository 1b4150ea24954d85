"""The soak. Two forms:

- `python -m bench.soak --hours 2 [--mode buffered-kv|picker-approx|both] [--rate R] [--out DIR]` (or
  `--minutes M` for a short run): the mixed soak of bench/soak_mixed.py (mixed traffic, bursts with admission,
  endpoint churn, every bound filled), with a JSON and markdown report and the targets beside the figures;
  exit status 1 when a target is missed.
- `make bench BENCH_ARGS="--cases soak"` (`run_soak` below): the original steady soak.

The steady soak: steady load through the shipped envoy/envoy.yaml for a long time, the sidecar's RSS every 30 s.

Real Envoy, simulated engines publishing KV events, the sidecar with its default bounds; every prompt is
unique (64 shared ~1,544-token prefixes, then the request's own number and words), and 5% of the clients hang
up mid-request. What it answers: after warm-up, does the sidecar's resident memory stay flat? The figure is
the growth from minute 5 to minute 30 (or the run's end), in percent. With `tracemalloc_interval_s` the
sidecar also writes tracemalloc snapshots (telemetry/memory_snapshots.py) for `python -m bench.soak_diff`.

The stack runs on private ports (the shipped config with its ports rewritten), not under the machine-wide
loopback lock: a 30-minute run would otherwise keep every other test run on this machine waiting.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testkit.envoy import EnvoyProc
from testkit.fleet import FleetProc
from testkit.metrics_text import metric_sum
from testkit.paths import ENVOY_CONFIG, REPO, TINY_TOKENIZER, repo_env
from testkit.ports import free_port
from testkit.procs import cpu_seconds
from testkit.sidecar import SidecarProc

from .loadgen import LoadResult, LoadSpec
from .stats import latency_summary_ms
from .workload import MODEL, PREFIX_TOKENS, PromptBuilder

log = logging.getLogger("bench.soak")

UNIQUE_MARKER = "@@REQUEST@@"
# Engines that cost little CPU (the sidecar is measured, not the engines) but keep each request open for its
# 4 decode steps of 25 ms (few events for the simulator, ~0.1 s per request), so hang-ups land mid-request
# and streams overlap.
SOAK_FLEET = ["--prefill-tokens-per-s", "1e9", "--prefill-overhead-ms", "0", "--lmcache-load-tokens-per-s", "1e9",
              "--decode-base-ms", "25", "--decode-per-seq-ms", "0", "--max-num-seqs", "4096",
              "--serialize-prefill", "0"]
# The soak's engines: one base IP of their own (not the shipped 127.0.0.2-4), so a soak never collides with
# a test run's fleet; each engine on its own loopback IP, as in the shipped config.
SOAK_BASE_IP = "127.0.77.2"
SHIPPED_ENGINES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
SHIPPED_ENGINE_PORT = 8000


@dataclass
class SoakConfig:
    out_dir: Path
    duration_s: float = 1800.0
    rate: float = 120.0
    hangup_fraction: float = 0.05
    hangup_within_s: float = 0.15  # a hang-up lands while the request runs (~0.1-0.2 s on these engines)
    sample_s: float = 30.0
    window_s: tuple[float, float] = (300.0, 1800.0)  # RSS growth from minute 5 to minute 30 (clipped)
    max_tokens: int = 4
    prefix_sources: str = "kv-events,approx"
    tracemalloc_interval_s: float = 0.0  # 0: off
    connections: int = 256
    seed: int = 1

    @property
    def log_dir(self) -> Path:
        return self.out_dir / "soak-logs"


@dataclass
class Sample:
    t_s: float
    rss_mb: float
    cpu_s: float
    heap_mb: float = 0.0  # resident in the malloc heap ([heap]: native code, objects above 512 B)
    anon_mb: float = 0.0  # resident in anonymous mappings (Python's small-object arenas, thread stacks)
    malloc_in_use_mb: float = 0.0  # live in malloc, after the sidecar's last trim (loadaware_malloc_in_use_bytes)
    malloc_mmapped_mb: float = 0.0  # of which in chunks above malloc's mmap threshold (large buffers)
    python_blocks: float = 0.0  # blocks Python's allocator has handed out (loadaware_python_allocated_blocks)
    kv_lag_s: float = 0.0  # the largest KV-events feed lag (loadaware_kv_events_lag_seconds): a growing queue
    # whose the anonymous pages are (anon_parts) and what malloc holds beside its live bytes
    glibc_arenas_mb: float = 0.0  # resident in glibc's thread arenas (threads other than the main one)
    thread_stacks_mb: float = 0.0  # resident in thread stacks
    other_anon_mb: float = 0.0  # the rest: Python's small-object arenas, malloc's mmapped chunks, libraries' maps
    malloc_free_mb: float = 0.0  # free inside malloc's arenas after the last trim (loadaware_malloc_free_bytes)
    malloc_system_mb: float = 0.0  # what malloc's arenas have from the system (loadaware_malloc_system_bytes)


def smaps_regions(pid: int) -> list[tuple[int, int, str, str, int]]:
    """`pid`'s mappings from /proc/PID/smaps: (start, end, permissions, name or "", resident KiB)."""
    regions: list[tuple[int, int, str, str, int]] = []
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            lo, hi = head[0].split("-")
            regions.append((int(lo, 16), int(hi, 16), head[1], head[5].strip() if len(head) == 6 else "", 0))
        elif line.startswith("Rss:") and regions:
            start, end, perms, name, _ = regions[-1]
            regions[-1] = (start, end, perms, name, int(line.split()[1]))
    return regions


def mapping_mb(pid: int) -> tuple[float, float]:
    """Resident MiB of `pid`'s [heap] and of its anonymous mappings (/proc/PID/smaps)."""
    regions = smaps_regions(pid)
    heap = sum(kib for *_, name, kib in regions if name == "[heap]")
    anon = sum(kib for *_, name, kib in regions if name == "")
    return heap / 1024, anon / 1024


GLIBC_HEAP_ALIGN = 64 * 2**20  # glibc maps each thread arena's heap at a multiple of HEAP_MAX_SIZE (64 MiB)
GUARD_MAX_BYTES = 64 * 1024  # a thread stack's PROT_NONE guard, right below it (a page by default)


def anon_parts(pid: int) -> tuple[float, float, float]:
    """Resident MiB of `pid`'s anonymous mappings by owner, from their layout in /proc/PID/smaps: (glibc's thread
    arenas, thread stacks, the rest). A thread arena's heap starts at a multiple of 64 MiB with its unused rest
    mapped PROT_NONE right above; a thread stack has a small PROT_NONE guard right below. The rest is Python's
    small-object arenas (1 MiB maps the kernel merges), malloc's chunks above its mmap threshold and libraries'
    own maps."""
    maps = smaps_regions(pid)
    arenas = stacks = other = 0
    for i, (start, end, perms, name, kib) in enumerate(maps):
        if name or not perms.startswith("rw"):
            continue
        above = maps[i + 1] if i + 1 < len(maps) else None
        below = maps[i - 1] if i > 0 else None
        if start % GLIBC_HEAP_ALIGN == 0 and (end - start == GLIBC_HEAP_ALIGN or (
                above is not None and above[0] == end and above[2].startswith("---"))):
            arenas += kib
        elif below is not None and below[1] == start and below[2].startswith("---") and not below[3] \
                and below[1] - below[0] <= GUARD_MAX_BYTES:
            stacks += kib
        else:
            other += kib
    return arenas / 1024, stacks / 1024, other / 1024


@dataclass
class SoakResult:
    samples: list[Sample] = field(default_factory=list)
    window_s: tuple[float, float] = (0.0, 0.0)
    rss_start_mb: float = 0.0
    rss_end_mb: float = 0.0
    growth_pct: float = 0.0
    load: dict[str, Any] = field(default_factory=dict)
    inflight_after: int | None = None
    stream_ends: dict[str, float] = field(default_factory=dict)
    gc_full: dict[str, float] = field(default_factory=dict)
    indexes: dict[str, Any] = field(default_factory=dict)
    tracemalloc_dir: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_lag_s(metrics_text: str) -> float:
    """The largest loadaware_kv_events_lag_seconds over the engines (0 without KV events)."""
    return max((float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines()
                if line.startswith("loadaware_kv_events_lag_seconds{")), default=0.0)


def malloc_in_use_mb(metrics_text: str) -> float:
    """The sidecar's loadaware_malloc_in_use_bytes in MiB; 0 before its first periodic collection."""
    return metric_sum(metrics_text, "loadaware_malloc_in_use_bytes") / 2**20


def read_malloc(sample: Sample, metrics_text: str) -> None:
    """The sidecar's own memory gauges into `sample`: live malloc, its mmapped part and Python's blocks."""
    sample.malloc_in_use_mb = malloc_in_use_mb(metrics_text)
    sample.malloc_mmapped_mb = metric_sum(metrics_text, "loadaware_malloc_mmapped_bytes") / 2**20
    sample.python_blocks = metric_sum(metrics_text, "loadaware_python_allocated_blocks")
    sample.malloc_free_mb = metric_sum(metrics_text, "loadaware_malloc_free_bytes") / 2**20
    sample.malloc_system_mb = metric_sum(metrics_text, "loadaware_malloc_system_bytes") / 2**20


def read_mappings(sample: Sample, pid: int) -> None:
    """The anonymous pages of `sample` split by owner (anon_parts); a process gone meanwhile leaves them 0."""
    with contextlib.suppress(OSError):
        sample.glibc_arenas_mb, sample.thread_stacks_mb, sample.other_anon_mb = anon_parts(pid)


def rss_mb(pid: int) -> float:
    """Resident set size of `pid` in MiB (VmRSS of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for pid {pid}")


def growth(samples: list[Sample], start_s: float, end_s: float) -> tuple[tuple[float, float], float, float, float]:
    """((t0, t1), RSS at t0, RSS at t1, growth %) between the samples nearest `start_s` and `end_s`."""
    if not samples:
        raise ValueError("no samples")
    first = min(samples, key=lambda s: abs(s.t_s - start_s))
    last = min(samples, key=lambda s: abs(s.t_s - end_s))
    pct = (last.rss_mb - first.rss_mb) / first.rss_mb * 100 if first.rss_mb else 0.0
    return (first.t_s, last.t_s), first.rss_mb, last.rss_mb, pct


def soak_bodies(prefixes: int = 64, per_prefix: int = 4, max_tokens: int = 4, seed: int = 11) -> list[str]:
    """/v1/completions bodies: a shared ~1,544-token prefix, then UNIQUE_MARKER (the loader writes the
    request's number there) and ~30 tokens of words, so every prompt and its last blocks are new."""
    b = PromptBuilder()
    rng = random.Random(seed)
    heads = [b.text(rng, PREFIX_TOKENS, lead=f"Document {k} about") for k in range(prefixes)]
    return [json.dumps({"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True,
                        "prompt": f"{heads[k]} request {UNIQUE_MARKER}{b.text(rng, 30)}"})
            for _ in range(per_prefix) for k in range(prefixes)]


def private_envoy_config(fleet: list[str], listen: int, admin: int, sidecar: int, out: Path) -> Path:
    """envoy/envoy.yaml with only its ports and engine addresses rewritten (a fleet of fewer engines than the
    shipped three: the shipped engines it lacks are left out of the cluster)."""
    if not 0 < len(fleet) <= len(SHIPPED_ENGINES):
        raise ValueError(f"envoy.yaml: a fleet of 1 to {len(SHIPPED_ENGINES)} engines, not {len(fleet)}")
    text = ENVOY_CONFIG.read_text()
    for old, new in ((10000, listen), (9901, admin), (9002, sidecar)):
        text = re.sub(rf"\bport_value:\s*{old}\b", f"port_value: {new}", text)
    for shipped, mine in zip(SHIPPED_ENGINES, fleet):
        host, port = mine.rsplit(":", 1)
        text, n = re.subn(rf"address: {re.escape(shipped)}, port_value: {SHIPPED_ENGINE_PORT}\b",
                          f"address: {host}, port_value: {port}", text)
        if n != 1:
            raise RuntimeError(f"envoy.yaml: expected one engine at {shipped}:{SHIPPED_ENGINE_PORT}, found {n}")
    for shipped in SHIPPED_ENGINES[len(fleet):]:
        text, n = re.subn(rf"^.*address: {re.escape(shipped)}, port_value: {SHIPPED_ENGINE_PORT}\b.*\n", "", text,
                          flags=re.MULTILINE)
        if n != 1:
            raise RuntimeError(f"envoy.yaml: expected one engine at {shipped}:{SHIPPED_ENGINE_PORT}, found {n}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


@contextlib.contextmanager
def soak_stack(cfg: SoakConfig) -> Iterator[tuple[SidecarProc, EnvoyProc]]:
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(FleetProc(
            cfg.log_dir, engines=3, base_ip=SOAK_BASE_IP, port=free_port(),
            extra_args=[*SOAK_FLEET, "--kv-events", "--kv-events-port", "0", "--kv-events-replay-port", "0"]))
        feeds = ",".join(f"{e['ip']}:{e['port']}={e['ip']}:{e['kv_events_port']}/{e['kv_events_replay_port']}"
                         for e in fleet.engines)
        sidecar_port = free_port()
        args = ["--listen", f"127.0.0.1:{sidecar_port}", "--endpoints", ",".join(fleet.endpoints),
                "--tokenizer", str(TINY_TOKENIZER), "--metrics-listen", f"127.0.0.1:{free_port()}",
                "--log-level", "warning", "--prefix-source", cfg.prefix_sources, "--kv-events-endpoints", feeds]
        if cfg.tracemalloc_interval_s > 0:
            args += ["--tracemalloc-dir", str(cfg.out_dir / "tracemalloc"),
                     "--tracemalloc-interval-s", f"{cfg.tracemalloc_interval_s:g}"]
        sidecar = stack.enter_context(SidecarProc(args, log_dir=cfg.log_dir))
        listen, admin = free_port(), free_port()
        config = private_envoy_config(fleet.endpoints, listen, admin, sidecar_port, cfg.log_dir / "envoy-soak.yaml")
        envoy = stack.enter_context(EnvoyProc(config, cfg.log_dir))
        yield sidecar, envoy


def run_soak(cfg: SoakConfig) -> SoakResult:
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    bodies = cfg.out_dir / "soak-bodies.json"
    bodies.write_text(json.dumps(soak_bodies(max_tokens=cfg.max_tokens)))
    result = SoakResult()
    with soak_stack(cfg) as (sidecar, envoy):
        spec = LoadSpec(url=f"{envoy.url}/v1/completions", rate=cfg.rate, duration=cfg.duration_s,
                        bodies_file=str(bodies), seed=cfg.seed, connections=cfg.connections,
                        hangup_fraction=cfg.hangup_fraction, hangup_within_s=cfg.hangup_within_s,
                        unique_marker=UNIQUE_MARKER)
        spec_path, out_path = cfg.out_dir / "soak.spec.json", cfg.out_dir / "soak.result.json"
        spec_path.write_text(json.dumps(asdict(spec)))
        out_path.unlink(missing_ok=True)
        t0 = time.monotonic()
        loader = subprocess.Popen([sys.executable, "-m", "bench.loadgen", str(spec_path), str(out_path)],
                                  cwd=REPO, env=repo_env(), stderr=subprocess.PIPE, text=True)
        try:
            next_at = 0.0
            while loader.poll() is None:
                now = time.monotonic() - t0
                if now >= next_at:
                    sample = Sample(round(now, 1), rss_mb(sidecar.pid), cpu_seconds(sidecar.pid),
                                    *mapping_mb(sidecar.pid))
                    read_mappings(sample, sidecar.pid)
                    with contextlib.suppress(Exception):
                        text = sidecar.metrics_text()
                        read_malloc(sample, text)
                        sample.kv_lag_s = kv_lag_s(text)
                    result.samples.append(sample)
                    log.info("soak t=%6.0fs sidecar RSS %.1f MiB (heap %.1f, anon %.1f, malloc in use %.1f) "
                             "cpu %.0f s, KV-events lag %.2f s", sample.t_s, sample.rss_mb, sample.heap_mb,
                             sample.anon_mb, sample.malloc_in_use_mb, sample.cpu_s, sample.kv_lag_s)
                    next_at += cfg.sample_s
                time.sleep(min(1.0, max(0.05, next_at - now)))
            stderr = loader.stderr.read() if loader.stderr else ""
        finally:
            if loader.poll() is None:
                loader.kill()
        if loader.returncode != 0 or not out_path.exists():
            raise RuntimeError(f"load generator failed (rc={loader.returncode}):\n{stderr[-3000:]}")
        time.sleep(1.0)  # the last streams end
        with contextlib.suppress(Exception):
            state = sidecar.debug_json("/debug/state")
            result.inflight_after = int(state["inflight_total"])
            prefix = state["prefix"]  # the bounded indexes at the end: full, or still filling?
            result.indexes = {"kv_events_blocks": prefix.get("kv_events", {}).get("total_blocks"),
                              "approx_blocks": prefix.get("approx", {}).get("total_blocks")}
        with contextlib.suppress(Exception):  # how the ext_proc streams ended (eof, cancelled, error)
            text = sidecar.metrics_text()
            result.stream_ends = {line.split('end="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                                  for line in text.splitlines() if line.startswith("loadaware_extproc_streams_total{")}
            # the periodic full collections (loadaware/collector.py): how many, and how long they held the loop
            result.gc_full = {line.split(" ")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                              if line.startswith("loadaware_gc_") and "_created " not in line}
        load = LoadResult.from_dict(json.loads(out_path.read_text()))
    end = min(cfg.window_s[1], cfg.duration_s)
    start = min(cfg.window_s[0], end / 2)  # a short diagnostic run: its second half
    result.window_s, result.rss_start_mb, result.rss_end_mb, result.growth_pct = growth(result.samples, start, end)
    result.load = {"offered_rate": load.offered_rate, "achieved_rate": load.achieved_rate, "scheduled": load.scheduled,
                   "sent": load.sent, "ok": load.ok, "errors": load.errors, "hangups": load.hangups,
                   "statuses": load.statuses, "latency_ms": latency_summary_ms(load.latencies_s),
                   "send_lag_p99_ms": load.send_lag_p99_ms}
    if cfg.tracemalloc_interval_s > 0:
        result.tracemalloc_dir = str(cfg.out_dir / "tracemalloc")
    return result


def soak_table(cfg: SoakConfig, r: SoakResult) -> str:
    load = r.load
    lines = [f"### Soak: {cfg.rate:g} req/s offered for {cfg.duration_s:g} s, {cfg.hangup_fraction:.0%} client "
             f"hang-ups, through envoy/envoy.yaml (prefix sources {cfg.prefix_sources})", "",
             f"- achieved {load['achieved_rate']:.1f} req/s OK ({load['ok']} OK, {load['hangups']} hang-ups, "
             f"{load['errors']} errors of {load['scheduled']}); p50 {load['latency_ms']['p50_ms']:.1f} ms, "
             f"p99 {load['latency_ms']['p99_ms']:.1f} ms; generator send lag p99 {load['send_lag_p99_ms']:.1f} ms",
             f"- statuses: {json.dumps(load['statuses'], sort_keys=True)}",
             f"- in flight after the run: {r.inflight_after}; ext_proc streams by end: "
             f"{json.dumps(r.stream_ends, sort_keys=True)}",
             f"- periodic full collections: {json.dumps(r.gc_full, sort_keys=True)}",
             f"- prefix indexes at the end: {json.dumps(r.indexes, sort_keys=True)}",
             f"- **RSS growth {r.growth_pct:+.1f}%** from t={r.window_s[0]:.0f} s ({r.rss_start_mb:.1f} MiB) to "
             f"t={r.window_s[1]:.0f} s ({r.rss_end_mb:.1f} MiB); target at most +5%", "",
             "| t (s) | RSS (MiB) | of it [heap] | of it anonymous | live in malloc (MiB) | sidecar CPU (s) "
             "| KV-events lag (s) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {s.t_s:.0f} | {s.rss_mb:.1f} | {s.heap_mb:.1f} | {s.anon_mb:.1f} | {s.malloc_in_use_mb:.1f} "
              f"| {s.cpu_s:.0f} | {s.kv_lag_s:.2f} |" for s in r.samples]
    if r.tracemalloc_dir:
        lines.append(f"\ntracemalloc snapshots: {r.tracemalloc_dir} (python -m bench.soak_diff {r.tracemalloc_dir})")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description="The mixed soak (bench/soak_mixed.py).")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--hours", type=float, default=None, help="length of the load (default 2)")
    length.add_argument("--minutes", type=float, default=None, help="length of the load, for short runs")
    p.add_argument("--mode", choices=("buffered-kv", "picker-approx", "both"), default="both",
                   help="buffered-kv: envoy.yaml + KV events; picker-approx: the endpoint picker + the approximate "
                        "source; both (default): side by side")
    p.add_argument("--rate", type=float, default=40.0, help="offered req/s per configuration outside bursts")
    p.add_argument("--out", default=str(REPO / "out" / "soak"), help="report folder (default out/soak)")
    p.add_argument("--sample-s", type=float, default=30.0, help="sampling period (default 30)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tracemalloc-s", type=float, default=0.0,
                   help="the sidecars write tracemalloc snapshots this often (python -m bench.soak_diff DIR)")
    p.add_argument("--glibc-tunables", default="",
                   help="GLIBC_TUNABLES for the sidecars, e.g. glibc.malloc.tcache_count=0: whether what live malloc "
                        "gains is glibc's per-thread caches filling (docs/memory.md)")
    p.add_argument("--memray-dir", default="",
                   help="run each sidecar under memray, recording to DIR/MODE.bin (read it with python -m "
                        "research.probes.memray_run)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from .soak_mixed import MODES, MixedConfig, run_mixed
    from .soak_report import markdown

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    minutes = args.minutes if args.minutes is not None else 60 * (args.hours if args.hours is not None else 2.0)
    out = Path(args.out)
    cfg = MixedConfig(out_dir=out, duration_s=minutes * 60, rate=args.rate, sample_s=args.sample_s, seed=args.seed,
                      modes=MODES if args.mode == "both" else (args.mode,), tracemalloc_interval_s=args.tracemalloc_s,
                      glibc_tunables=args.glibc_tunables, memray_dir=args.memray_dir)
    # Churn and bursts every few minutes over hours; a short run gets the same number of each in proportion.
    if cfg.duration_s < 3600:
        cfg.churn_every_s = max(60.0, cfg.duration_s / 4)
        cfg.churn_out_s = min(cfg.churn_out_s, cfg.churn_every_s / 2)
        cfg.burst_every_s = max(60.0, cfg.duration_s / 3)
    report = run_mixed(cfg)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    (out / "report.md").write_text(text)
    print(text)
    return 0 if all(r["passed"] for r in report["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
