"""Shared by the discovery end-to-end tests: steady traffic through Envoy that records where every request
went, and a small client of the sidecar's loadaware.v1 API to see what the sidecar's fleet is."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import aiohttp
import grpc

from sidecar.api.v1 import loadaware_pb2 as pb
from sidecar.api.v1 import loadaware_pb2_grpc as pb_grpc


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

    def __enter__(self) -> "Traffic":
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

    def wait_routable(self, expected: Iterable[str], timeout: float = 10.0) -> float:
        """Wait until the sidecar routes to exactly `expected`; returns when it was first seen so."""
        want = set(expected)
        deadline = time.monotonic() + timeout
        while True:
            if self.routable() == want:
                return time.monotonic()
            if time.monotonic() > deadline:
                raise AssertionError(f"sidecar routes to {sorted(self.routable())}, expected {sorted(want)}")
            time.sleep(0.05)

    def close(self) -> None:
        self.channel.close()


def wait_for(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
