"""Case 8 (`table`): one table of CPU per request and latency for every way of routing, in one run.

    python -m bench.run --cases table [--rate 200] [--duration 15] [--table-arms all]

Rows (bench/table_arms.py): (a) Envoy alone; Envoy + sidecar in BUFFERED mode with the approximate prefix
source (b) without and (c) with the tokenizer, (d) the LMCache and (e) the KV-events source (tokenizer on);
the same in full-duplex (picker) mode, approx source, (f) without and (g) with the tokenizer; the peer routers
(h) sglang-router and (i) vllm-router with `--policy cache_aware` from `.peers-venv`.

One fleet (FAST_FLEET engines, reporting to a real LMCache controller and publishing KV events) serves every
row, so the engines are the same; each row gets its own router processes (only those run during its window),
the same 1,578-token /v1/completions bodies (max_tokens 1) at the same open-loop rate, a warm-up and then
`duration` measured seconds. A row that cannot run (no `.peers-venv`, no LMCache venv, a start failure) says
why instead of failing the table.

The fleet and the sidecar bind the shipped fixed addresses: the case runs under testkit's loopback lock.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from testkit.envoy import EnvoyProc
from testkit.fleet import FleetProc
from testkit.lmcache import LMCacheControllerProc
from testkit.loopback_lock import loopback_lock
from testkit.peers import PEER_VERSIONS, PEERS_VENV_BIN, PeerProc, peers_available
from testkit.ports import SIDECAR_PORT, free_port
from testkit.procs import ManagedProc, ProcError
from testkit.retry import start_with_retries
from testkit.sidecar import SidecarProc

from . import promtext
from .cases import FAST_FLEET, BenchConfig, CaseResults, decision_bodies_files, load_spec, log_arm
from .measure import ArmResult, measure
from .table_arms import ARMS, SidecarSetup, TableArm, run_order

log = logging.getLogger("bench")
CASE = "table"
PREFIX_GAUGES = ("loadaware_kv_index_blocks", "loadaware_approx_index_blocks", "loadaware_prefix_match_fraction")


@dataclass
class TableRow:
    arm: TableArm
    result: ArmResult | None = None
    error: str = ""  # why the row has no figures (or what went wrong in them)
    # The sidecar's prefix-source gauges after the window: evidence that the source had something to say.
    prefix_state: dict[str, float] = field(default_factory=dict)


def router_procs(arm: TableArm) -> tuple[str, ...]:
    """The processes whose CPU is this row's cost of routing. The LMCache controller counts only where the
    sidecar asks it (row d): elsewhere it merely ingests the engines' admits, which every row has."""
    if arm.kind == "peer":
        return ("router",)
    if arm.sidecar is None:
        return ("envoy",)
    return ("envoy", "sidecar", "lmcache") if arm.sidecar.prefix_source == "lmcache" else ("envoy", "sidecar")


def prefix_state(metrics_text: str) -> dict[str, float]:
    """PREFIX_GAUGES summed over their labels (per-engine block counts add up to the index's size)."""
    out: dict[str, float] = {}
    for (name, _), value in promtext.parse_samples(metrics_text).items():
        if name in PREFIX_GAUGES:
            out[name] = out.get(name, 0.0) + value
    return out


def _sidecar_prefix_state(sidecar: SidecarProc) -> dict[str, float]:
    try:
        return prefix_state(sidecar.metrics_text())
    except Exception:  # noqa: BLE001 - the gauges are a bonus: a failed scrape must not cost the row
        return {}


class Sidecars:
    """At most one sidecar process at a time, kept while consecutive arms share its setup."""

    def __init__(self, cfg: BenchConfig, endpoints: list[str], lmcache: LMCacheControllerProc | None) -> None:
        self.cfg, self.endpoints, self.lmcache = cfg, endpoints, lmcache
        self.setup: SidecarSetup | None = None
        self.proc: SidecarProc | None = None

    def get(self, setup: SidecarSetup) -> SidecarProc:
        if self.proc is not None and self.setup == setup and self.proc.running:
            return self.proc
        self.stop()
        lmcache_url = self.lmcache.url if self.lmcache is not None else None
        args = setup.args(self.endpoints, f"127.0.0.1:{SIDECAR_PORT}", f"127.0.0.1:{free_port()}", lmcache_url)
        proc = SidecarProc(args, log_dir=self.cfg.log_dir)
        start_with_retries(proc.start, attempts=self.cfg.start_retries, what="sidecar", delay_s=10.0)
        self.setup, self.proc = setup, proc
        return proc

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
        self.setup = self.proc = None


P = TypeVar("P", bound=ManagedProc)


@contextlib.contextmanager
def started(proc: P, cfg: BenchConfig, what: str) -> Iterator[P]:
    start_with_retries(proc.start, attempts=cfg.start_retries, what=what, delay_s=10.0)
    try:
        yield proc
    finally:
        proc.stop()


def _unavailable(arm: TableArm, lmcache: LMCacheControllerProc | None) -> str:
    if arm.kind == "peer" and not peers_available():
        return f"not installed ({PEERS_VENV_BIN} has no {arm.peer}): run `make peers`"
    if arm.sidecar is not None and arm.sidecar.prefix_source == "lmcache" and lmcache is None:
        return "LMCache controller unavailable: run `make lmcache`"
    return ""


def _run_arm(cfg: BenchConfig, arm: TableArm, bodies_file: str, fleet: FleetProc,
             lmcache: LMCacheControllerProc | None, sidecars: Sidecars) -> ArmResult:
    background: dict[str, ManagedProc] = {"fleet": fleet}
    if lmcache is not None:
        background["lmcache"] = lmcache

    def one(url: str, procs: dict[str, ManagedProc], sidecar: SidecarProc | None) -> ArmResult:
        spec = load_spec(cfg, f"{url}/v1/completions", cfg.rate, cfg.duration, bodies_file=bodies_file)
        return measure(CASE, arm.name, spec, {**procs, **background}, cfg.work_dir, sidecar=sidecar,
                       warmup_s=cfg.warmup)

    if arm.kind == "peer":
        sidecars.stop()  # a peer's window has no sidecar running beside it
        peer = PeerProc(arm.peer, [e["url"] for e in fleet.engines], cfg.log_dir)
        with started(peer, cfg, arm.peer):
            return one(peer.url, {"router": peer}, None)
    assert arm.envoy_config is not None
    sidecar = sidecars.get(arm.sidecar) if arm.sidecar is not None else None
    if sidecar is None:
        sidecars.stop()
    envoy = EnvoyProc(arm.envoy_config if arm.response_headers else without_response_headers(cfg, arm.envoy_config),
                      cfg.log_dir)
    with started(envoy, cfg, envoy.name):
        procs: dict[str, ManagedProc] = {"envoy": envoy}
        if sidecar is not None:
            procs["sidecar"] = sidecar
        return one(envoy.url, procs, sidecar)


def without_response_headers(cfg: BenchConfig, config: Path) -> Path:
    """The shipped BUFFERED config as it was before failure-aware routing: no response headers to ext_proc."""
    text, n = re.subn(r"response_header_mode: SEND", "response_header_mode: SKIP", config.read_text())
    if n != 1:
        raise ValueError(f"{config}: expected one response_header_mode: SEND, found {n}")
    path = cfg.work_dir / f"{config.stem}-no-response-headers.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@contextlib.contextmanager
def table_fleet(cfg: BenchConfig, arms: tuple[TableArm, ...]
                ) -> Iterator[tuple[FleetProc, LMCacheControllerProc | None]]:
    """The engines every row shares (with the LMCache controller and KV events only when a row asks for
    them), under the loopback lock; the LMCache controller is None when it is missing or would not start."""
    wants_lmcache = any(a.sidecar is not None and a.sidecar.prefix_source == "lmcache" for a in arms)
    wants_kv = any(a.sidecar is not None and a.sidecar.prefix_source == "kv-events" for a in arms)
    with loopback_lock(), contextlib.ExitStack() as stack:
        lmcache: LMCacheControllerProc | None = None
        if wants_lmcache and LMCacheControllerProc.available():
            try:
                lmcache = stack.enter_context(started(LMCacheControllerProc(cfg.log_dir), cfg, "LMCache"))
            except ProcError as exc:  # only row d needs it: that row says so, the others still run
                log.warning("LMCache controller did not start, row d is skipped: %s", str(exc).splitlines()[0])
        fleet = FleetProc(cfg.log_dir, engines=3, lmcache=lmcache,
                          extra_args=[*FAST_FLEET, *(["--kv-events"] if wants_kv else [])])
        stack.enter_context(started(fleet, cfg, "fleet"))
        yield fleet, lmcache


def run_table(cfg: BenchConfig, results: CaseResults, arms: tuple[TableArm, ...] = ARMS) -> list[TableRow]:
    """Every arm in `arms` on one fleet; returns the rows in table order (a failed row carries its error)."""
    _, bodies_file = decision_bodies_files(cfg)
    rows = {arm.key: TableRow(arm) for arm in arms}
    with table_fleet(cfg, arms) as (fleet, lmcache), contextlib.ExitStack() as stack:
        sidecars = Sidecars(cfg, fleet.endpoints, lmcache)
        stack.callback(sidecars.stop)
        for arm in run_order(arms):
            row = rows[arm.key]
            row.error = _unavailable(arm, lmcache)
            if row.error:
                log.warning("table %s (%s): %s", arm.key, arm.name, row.error)
                continue
            try:
                row.result = _run_arm(cfg, arm, bodies_file, fleet, lmcache, sidecars)
                if arm.sidecar is not None and sidecars.proc is not None:
                    row.prefix_state = _sidecar_prefix_state(sidecars.proc)
            except Exception as exc:  # one row failing (logged with its traceback) must not lose the others
                row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                log.exception("table %s (%s) failed", arm.key, arm.name)
                continue
            results.arms.append(row.result)
            log_arm(row.result, f"router={row.result.cpu_us_per_request.get('router', 0.0):.0f}us/req")
    return [rows[a.key] for a in arms]


def table_config(cfg: BenchConfig, arms: tuple[TableArm, ...]) -> dict[str, Any]:
    """What results.json records about the table's setup beside the shared config."""
    return {"arms": [a.name for a in arms], "peer_versions": PEER_VERSIONS, "fast_fleet": FAST_FLEET,
            "rate": cfg.rate, "duration_s": cfg.duration, "warmup_s": cfg.warmup, "arrivals": cfg.arrivals}
