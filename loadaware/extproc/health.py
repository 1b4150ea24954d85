"""gRPC health for the ext_proc port: who may send traffic, and whether the process is alive.

Service names (the Endpoint Picker Protocol's): "readiness", "" and the ext_proc service follow readiness
(NOT_SERVING with an empty fleet, before the first scrape round, while draining); "liveness" is SERVING for
as long as the process serves, so an empty fleet never gets the pod restarted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from loadaware.extproc.stream import SERVICE_NAME

log = logging.getLogger(__name__)

LIVENESS_SERVICE = "liveness"
READINESS_SERVICE = "readiness"
READINESS_SERVICES = ("", READINESS_SERVICE, SERVICE_NAME)
POLL_S = 0.2
SERVING = health_pb2.HealthCheckResponse.SERVING


class HealthReporter:
    def __init__(self, ready: Callable[[], bool], why_not: Callable[[], str] | None = None) -> None:
        self.ready = ready
        self.why_not = why_not  # what readiness waits for, logged when it turns NOT_SERVING
        self.servicer = health.aio.HealthServicer()
        self._stopping = asyncio.Event()

    def add_to(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def start(self) -> None:
        await self._set(READINESS_SERVICES, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._set((LIVENESS_SERVICE,), health_pb2.HealthCheckResponse.SERVING)

    async def run(self) -> None:
        """Follow readiness until draining starts."""
        status = None
        shown: tuple[object, str] | None = None  # what was last logged: a new reason is news too
        while True:
            want = health_pb2.HealthCheckResponse.SERVING if self.ready() and not self._stopping.is_set() \
                else health_pb2.HealthCheckResponse.NOT_SERVING
            reason = self.why_not() if self.why_not is not None and want != SERVING else ""
            if want != status:
                status = want
                await self._set(READINESS_SERVICES, want)
            if shown != (want, reason):
                shown = (want, reason)
                log.info("health %s%s", health_pb2.HealthCheckResponse.ServingStatus.Name(want),
                         f" ({reason})" if reason else "")
            await asyncio.sleep(POLL_S)

    async def draining(self) -> None:
        self._stopping.set()
        await self._set(READINESS_SERVICES, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def _set(self, names: tuple[str, ...], status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
        for name in names:
            await self.servicer.set(name, status)
