"""A discovery source against the stand-in Kubernetes API server, feeding a real catalog and registry: what the
EndpointSlice and InferencePool discovery tests share."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry

from loadaware.fleet.discovery.catalog import DiscoveryCatalog
from loadaware.fleet.discovery.kubernetes import make_api_client
from loadaware.fleet.discovery.metrics import DiscoveryMetrics
from loadaware.fleet.registry import EndpointRegistry
from testkit.k8s_apiserver import StandInApiServer
from tests.conftest import wait_until_async


class Source(Protocol):
    async def run(self) -> None: ...


S = TypeVar("S", bound=Source)


class DiscoveryHarness(Generic[S]):
    def __init__(self, server: StandInApiServer, tmp_path: Path, mode: str,
                 make_source: Callable[[DiscoveryCatalog, DiscoveryMetrics, Callable[[], Any]], S]) -> None:
        self.server = server
        self.registry = EndpointRegistry()
        self.removed: list[str] = []
        self.registry.on_removed(self.removed.append)
        self.ids: dict[str, str] = {}
        self.catalog = DiscoveryCatalog(mode, self.registry, on_instance_ids=self._ids)
        self.metrics = DiscoveryMetrics(CollectorRegistry())
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps(server.kubeconfig()))
        self.source = make_source(self.catalog, self.metrics, lambda: make_api_client(str(kubeconfig)))
        self.task: asyncio.Task[None] | None = None

    def _ids(self, ids: Any) -> None:
        self.ids = dict(ids)

    def start(self) -> None:
        self.task = asyncio.create_task(self.source.run())

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def until(self, cond: Callable[[], bool], what: str) -> None:
        await wait_until_async(cond, message=what, interval=0.01)


H = TypeVar("H", bound=DiscoveryHarness[Any])


@contextlib.asynccontextmanager
async def on_stand_in_server(make: Callable[[StandInApiServer], H]) -> AsyncIterator[H]:
    """A harness on a fresh stand-in API server (namespace llm); its source and the server stopped after."""
    server = StandInApiServer(namespace="llm")
    await server.start()
    harness = make(server)
    try:
        yield harness
    finally:
        if harness.task is not None:
            await harness.stop()
        await server.stop()
