"""Shared by the operations end-to-end tests: steady traffic through Envoy that records where every request
went, a small client of the sidecar's loadaware.v1 API, and a whole stack on free loopback addresses (no
queueing on the lock that guards the shipped fixed addresses)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc

from loadaware.api.v1 import loadaware_pb2 as pb
from loadaware.api.v1 import loadaware_pb2_grpc as pb_grpc
from testkit.envoy import EnvoyProc
from testkit.envoy_eds import eds_config, write_assignment
from testkit.fleet import FleetProc
from testkit.lmcache import LMCacheControllerProc
from testkit.paths import TINY_TOKENIZER
from testkit.ports import free_port
from testkit.sidecar import SidecarProc
from tests.conftest import wait_until


@dataclass(frozen=True)
class Sent:
    started: float  # time.monotonic()
    status: int  # 0: the request itself failed (connection error, timeout)
    served_by: str
    error: str = ""


@dataclass
class Traffic:
    """`workers` clients each sending completions back to back until stopped (bounded by max_s)."""

    url: str
    workers: int = 4
    max_s: float = 60.0
    sent: list[Sent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="traffic", daemon=True)

    async def _run(self) -> None:
        deadline = time.monotonic() + self.max_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
            async def worker(w: int) -> None:
                i = 0
                while not self._stop.is_set() and time.monotonic() < deadline:
                    i += 1
                    started = time.monotonic()
                    body = {"model": "tiny-model", "prompt": f"worker {w} request {i} about the gateway",
                            "max_tokens": 4}
                    try:
                        async with session.post(self.url + "/v1/completions", json=body) as resp:
                            await resp.read()
                            self.sent.append(Sent(started, resp.status, resp.headers.get("x-served-by", "")))
                    except Exception as exc:  # noqa: BLE001 - recorded as a failed request
                        self.sent.append(Sent(started, 0, "", repr(exc)))
            await asyncio.gather(*(worker(w) for w in range(self.workers)))

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def between(self, start: float, end: float) -> list[Sent]:
        return [s for s in list(self.sent) if start <= s.started < end]

    def failures(self) -> list[Sent]:
        return [s for s in self.sent if s.status != 200]


class RouterClient:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.RouterStub(self.channel)

    def endpoints(self) -> pb.ListEndpointsResponse:
        return self.stub.ListEndpoints(pb.ListEndpointsRequest(), timeout=5)

    def routable(self) -> set[str]:
        return {e.endpoint for e in self.endpoints().endpoints if e.routable}

    def wait_routable(self, expected: Iterable[str]) -> float:
        """Wait until the sidecar routes to exactly `expected`; returns when it was first seen so."""
        want = set(expected)
        wait_until(lambda: self.routable() == want,
                   message=lambda: f"the sidecar to route to {sorted(want)} (it routes to {sorted(self.routable())})")
        return time.monotonic()

    def close(self) -> None:
        self.channel.close()


def free_fleet_address(engines: int) -> tuple[str, int]:
    """A loopback base ip and one port free on each of `engines` consecutive ips, away from the shipped
    fixed addresses (127.0.0.2-4:8000), so these tests need not queue on testkit.loopback_lock.loopback_lock()."""
    import ipaddress
    import random
    import socket

    rng = random.Random()
    for _ in range(50):
        base = ipaddress.ip_address(f"127.{rng.randrange(20, 250)}.{rng.randrange(0, 250)}.10")
        with socket.socket() as s:
            s.bind((str(base), 0))
            port = int(s.getsockname()[1])
        try:
            for i in range(1, engines):
                with socket.socket() as s:
                    s.bind((str(base + i), port))
        except OSError:
            continue
        return str(base), port
    raise RuntimeError("no free loopback address block")


class FreeStack:
    """LMCache controller (optional) + engines + sidecar + Envoy on free addresses only. Envoy's engines
    cluster is EDS from a file listing the fleet (testkit.envoy_eds), its sidecar cluster the sidecar's port."""

    def __init__(self, log_dir: Path, engines: int = 3, lmcache: bool = True,
                 sidecar_args: Sequence[str] = (), fleet_args: Sequence[str] = ()) -> None:
        self.log_dir = log_dir
        self.engines = engines
        self.use_lmcache = lmcache
        self.sidecar_args = list(sidecar_args)
        self.fleet_args = list(fleet_args)
        self._exit = contextlib.ExitStack()
        self.lmcache: LMCacheControllerProc | None = None
        self.fleet: FleetProc | None = None
        self.sidecar: SidecarProc | None = None
        self.envoy: EnvoyProc | None = None

    @property
    def url(self) -> str:
        assert self.envoy is not None
        return self.envoy.url

    def __enter__(self) -> FreeStack:
        try:
            if self.use_lmcache:
                self.lmcache = self._exit.enter_context(LMCacheControllerProc(self.log_dir))
            base_ip, port = free_fleet_address(self.engines)
            self.fleet = self._exit.enter_context(FleetProc(self.log_dir, engines=self.engines, base_ip=base_ip,
                                                            port=port, lmcache=self.lmcache,
                                                            extra_args=self.fleet_args))
            sidecar_port = free_port()
            args = ["--listen", f"127.0.0.1:{sidecar_port}", "--metrics-listen", f"127.0.0.1:{free_port()}",
                    "--endpoints", ",".join(self.fleet.endpoints), "--tokenizer", str(TINY_TOKENIZER)]
            if self.lmcache is not None:
                args += ["--lmcache-url", self.lmcache.url]
            self.sidecar = self._exit.enter_context(SidecarProc([*args, *self.sidecar_args], log_dir=self.log_dir))
            eds_dir = self.log_dir / "eds"
            eds_dir.mkdir(exist_ok=True)
            write_assignment(eds_dir, [(ep, "HEALTHY") for ep in self.fleet.endpoints], 1)
            config = eds_config(eds_dir, listen_port=free_port(), admin_port=free_port(), sidecar_port=sidecar_port)
            self.envoy = self._exit.enter_context(EnvoyProc(config, self.log_dir))
        except BaseException:
            self._exit.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._exit.close()
