"""Case 9 (`floor`): what the gRPC transport alone costs per request, and what moves it.

Envoy (envoy/envoy.yaml, BUFFERED, three ext_proc messages per request) in front of the same fast engines,
with the same 1,578-token bodies at the same open-loop rate as the table, and behind it in turn:

- a stand-in server that only speaks the protocol (bench/floor_server.py): grpc.aio on uvloop (the sidecar's
  server), the same on asyncio's loop, grpcio's thread-pool server, and two aio processes sharing the port
  with SO_REUSEPORT;
- the real sidecar with policy leastload and no tokenizer (the protocol plus parsing, the pipeline,
  metrics and the lifecycle), then as the table's row c (loadaware, tokenizer, approximate prefix index).

The first rows are the floor any Python ext_proc server on grpcio pays; the sidecar's figure above the aio
floor is its own code. One process (and one Envoy connection per Envoy worker) per row.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from testkit.envoy import EnvoyProc
from testkit.fleet import FleetProc
from testkit.loopback_lock import loopback_lock
from testkit.paths import ENVOY_CONFIG, ENVOY_PASSTHROUGH_CONFIG, TINY_TOKENIZER
from testkit.ports import accepts, free_port
from testkit.procs import ManagedProc, cpu_seconds
from testkit.sidecar import SidecarProc

from .cases import FAST_FLEET, BenchConfig, CaseResults, decision_bodies_files, load_spec
from .floor_server import children_cpu_pids
from .measure import ArmResult, measure

log = logging.getLogger("bench")
CASE = "floor"


class FloorProc(ManagedProc):
    """bench/floor_server.py; its CPU is its own plus its worker processes'."""

    name = "floor"

    def __init__(self, port: int, engines: list[str], server: str, processes: int, log_dir: Any,
                 loop: str = "uvloop") -> None:
        self.port = port
        self.name = f"floor-{server}-{loop}-x{processes}"
        super().__init__([sys.executable, "-m", "bench.floor_server", "--port", str(port), "--engines",
                          ",".join(engines), "--server", server, "--processes", str(processes), "--loop", loop],
                         log_dir)

    def _is_ready(self) -> bool:
        return accepts("127.0.0.1", self.port)

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(pid) for pid in children_cpu_pids(self.pid))


@dataclass(frozen=True)
class FloorRow:
    name: str
    label: str
    server: str = ""  # aio | sync: the stand-in; "" with sidecar_args: the real sidecar; neither: Envoy alone
    processes: int = 1
    sidecar_args: tuple[str, ...] = ()
    loop: str = "uvloop"  # as the sidecar


ROWS = (
    FloorRow("envoy_alone", "Envoy alone (no ext_proc)"),
    FloorRow("floor_aio", "stand-in, grpc.aio on uvloop (as the sidecar), 1 process", "aio"),
    FloorRow("floor_sync", "stand-in, grpcio thread-pool server, 1 process", "sync"),
    FloorRow("floor_aio_x2", "stand-in, grpc.aio, 2 processes (SO_REUSEPORT)", "aio", 2),
    FloorRow("floor_grpclib", "stand-in, grpclib (pure-Python gRPC on uvloop), 1 process", "grpclib"),
    FloorRow("floor_aio_asyncio", "stand-in, grpc.aio on asyncio's loop, 1 process", "aio", loop="asyncio"),
    FloorRow("sidecar_leastload", "sidecar, leastload, no tokenizer", sidecar_args=(
        "--policy", "leastload", "--prefix-source", "approx")),
    FloorRow("sidecar_default_tok", "sidecar, the default policy, tokenizer, approx (table row c)", sidecar_args=(
        "--prefix-source", "approx", "--tokenizer", str(TINY_TOKENIZER))),
    FloorRow("sidecar_default_tok_threads", "the same, every encode in a worker thread", sidecar_args=(
        "--prefix-source", "approx", "--tokenizer", str(TINY_TOKENIZER),
        "--tokenizer-inline-chars", "0")),
)


@contextlib.contextmanager
def _router(cfg: BenchConfig, row: FloorRow, engines: list[str]) -> Iterator[tuple[str, dict[str, ManagedProc],
                                                                                  SidecarProc | None]]:
    if not row.server and not row.sidecar_args:
        with EnvoyProc(ENVOY_PASSTHROUGH_CONFIG, cfg.log_dir, listen_port=free_port(),
                       admin_port=free_port()) as envoy:
            yield envoy.url, {"envoy": envoy}, None
        return
    port = free_port()
    server: ManagedProc
    sidecar: SidecarProc | None = None
    if row.server:
        server = FloorProc(port, engines, row.server, row.processes, cfg.log_dir, row.loop)
    else:
        server = sidecar = SidecarProc(["--listen", f"127.0.0.1:{port}", "--endpoints", ",".join(engines),
                                        "--metrics-listen", f"127.0.0.1:{free_port()}", "--log-level", "warning",
                                        *row.sidecar_args], log_dir=cfg.log_dir)
    with server, EnvoyProc(ENVOY_CONFIG, cfg.log_dir, listen_port=free_port(), admin_port=free_port(),
                           sidecar_port=port) as envoy:
        yield envoy.url, {"envoy": envoy, "sidecar": server}, sidecar


def run_floor(cfg: BenchConfig, results: CaseResults) -> list[dict[str, Any]]:
    _, bodies_file = decision_bodies_files(cfg)
    rows: list[dict[str, Any]] = []
    with loopback_lock(), FleetProc(cfg.log_dir, engines=3, extra_args=FAST_FLEET) as fleet:
        for row in ROWS:
            try:
                with _router(cfg, row, fleet.endpoints) as (url, procs, sidecar):
                    spec = load_spec(cfg, f"{url}/v1/completions", cfg.rate, cfg.duration, bodies_file=bodies_file)
                    arm = measure(CASE, row.name, spec, {**procs, "fleet": fleet}, cfg.work_dir, sidecar=sidecar,
                                  warmup_s=cfg.warmup)
            except Exception as exc:  # one row failing must not lose the others
                log.exception("floor row %s failed", row.name)
                rows.append({"name": row.name, "label": row.label, "error": f"{type(exc).__name__}: {exc}"})
                continue
            results.arms.append(arm)
            rows.append(_figures(row, arm))
            log.info("floor %-22s server=%.0fus/req envoy=%.0fus/req p50=%.2fms p99=%.2fms", row.name,
                     arm.cpu_us_per_request.get("sidecar", 0.0), arm.cpu_us_per_request.get("envoy", 0.0),
                     arm.latency["p50_ms"], arm.latency["p99_ms"])
    return rows


def _figures(row: FloorRow, arm: ArmResult) -> dict[str, Any]:
    cpu = arm.cpu_us_per_request
    return {"name": row.name, "label": row.label, "error": None, "server_us": cpu.get("sidecar"),
            "envoy_us": cpu.get("envoy"), "p50_ms": arm.latency["p50_ms"], "p99_ms": arm.latency["p99_ms"],
            "achieved_rate": arm.achieved_rate, "errors": arm.errors,
            "other_us": cpu.get("outside", 0.0)}


def floor_table(rows: list[dict[str, Any]]) -> str:
    lines = ["### 9. The transport's floor: BUFFERED ext_proc behind Envoy, CPU per request", "",
             "| server | server µs/req | Envoy µs/req | p50 ms | p99 ms | req/s | errors | other CPU µs/req |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['label']} | not run: {r['error']} | | | | | | |")
            continue
        server = "" if r["server_us"] is None else f"{r['server_us']:,.0f}"
        lines.append(f"| {r['label']} | {server} | {r['envoy_us']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                     f"{r['achieved_rate']:.0f} | {r['errors']} | {r['other_us']:,.0f} |")
    return "\n".join(lines)
