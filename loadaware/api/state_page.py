"""The /debug/state document: readiness and its reason, the supervised tasks, open streams, one row per
endpoint (load, in flight, routing health, LMCache instance, models, scraped load), the instance map, the
configuration and the prefix sources' state.

Built in a thread, as /metrics is: one row per endpoint is a lot of work at 10,000.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

from loadaware.admission.controller import AdmissionController
from loadaware.api.offloop import off_loop
from loadaware.fleet.health import EndpointHealth
from loadaware.fleet.models import EndpointModels
from loadaware.fleet.registry import EndpointRegistry
from loadaware.load.tracker import LoadTracker
from loadaware.prefix.lmcache.bridge import InstanceBridge
from loadaware.prefix.queued import QueuedPrefixes
from loadaware.prefix.wiring import PrefixWiring
from loadaware.prefix.working_set import WorkingSet


class ReadinessView(Protocol):
    def ready(self) -> bool: ...
    def reason(self) -> str: ...


class StreamCounts(Protocol):
    open_streams: int
    modes: dict[str, int]


class StatePage:
    def __init__(self, registry: EndpointRegistry, loads: LoadTracker, health: EndpointHealth,
                 models: EndpointModels | None, bridge: InstanceBridge, prefixes: PrefixWiring,
                 readiness: ReadinessView, tasks: Callable[[], list[dict[str, Any]]], streams: StreamCounts,
                 config: Callable[[], list[dict[str, Any]]], working_set: WorkingSet | None = None,
                 queued: QueuedPrefixes | None = None, admission: AdmissionController | None = None) -> None:
        self.registry = registry
        self.admission = admission
        self.working_set = working_set
        self.queued = queued
        self.loads = loads
        self.health = health
        self.models = models
        self.bridge = bridge
        self.prefixes = prefixes
        self.readiness = readiness
        self.tasks = tasks
        self.streams = streams
        self.config = config

    async def render(self) -> dict[str, Any]:
        return await off_loop(self.render_now)

    def render_now(self) -> dict[str, Any]:
        endpoints = self.registry.snapshot()
        loads = self.loads.loads(endpoints) if endpoints else []
        models = self.models.state(endpoints) if self.models is not None else {}  # None: unknown, serves any
        rows = []
        for ep, load in zip(endpoints, loads):
            st = self.loads.fresh_stats(ep)
            rows.append({"endpoint": ep, "load": load, "inflight": self.loads.count(ep),
                         "routing_health": asdict(self.health.view(ep)),
                         "instance_id": self.bridge.instance_for(ep), "models": models.get(ep),
                         "scraped": None if st is None else {"running": st.running, "waiting": st.waiting,
                                                             "kv_usage": st.kv_usage,
                                                             "kv_capacity_tokens": st.kv_capacity_tokens}})
        reason = self.readiness.reason()
        return {"ready": not reason, "not_ready_reason": reason, "tasks": self.tasks(),
                "open_streams": self.streams.open_streams, "streams_by_mode": dict(self.streams.modes),
                "inflight": self.loads.snapshot(), "inflight_total": self.loads.total(), "endpoints": rows,
                "instance_map": self.bridge.mapping(), "config": self.config(),
                "prefix": self.prefixes.state(), "fleet_kv_capacity_tokens": self.loads.kv_capacity_tokens(),
                "working_set": None if self.working_set is None else self.working_set.state(),
                "queued_prefixes": None if self.queued is None else self.queued.state(),
                "admission": self._admission()}

    def _admission(self) -> dict[str, Any] | None:
        """The held requests (--admission), oldest first within each band, highest band first. Read from this
        thread while the loop may change the queue: a read that races a change says so instead of failing."""
        if self.admission is None:
            return None
        try:
            return self.admission.state()
        except RuntimeError:  # the queue changed while it was walked
            return {"held": len(self.admission.queue), "note": "the queue changed while read; ask again"}
