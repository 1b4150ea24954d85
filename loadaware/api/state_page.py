"""The /debug/state document: readiness and its reason, the supervised tasks, open streams, one row per
endpoint (load, in flight, routing health, LMCache instance, models, scraped load), the instance map, the
configuration and the prefix sources' state, read through the running sidecar's view (api/view.py).

Built in a thread, as /metrics is: one row per endpoint is a lot of work at 10,000.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from loadaware.api.offloop import off_loop
from loadaware.api.view import SidecarView


class StatePage:
    def __init__(self, view: SidecarView) -> None:
        self.fleet = view.fleet
        self.prefix = view.prefix
        self.process = view.process
        self.admission = view.decision.admission

    async def render(self) -> dict[str, Any]:
        return await off_loop(self.render_now)

    def render_now(self) -> dict[str, Any]:
        fleet, prefix, process = self.fleet, self.prefix, self.process
        loads, bridge = fleet.loads, prefix.bridge
        endpoints = fleet.registry.snapshot()
        loaded = loads.loads(endpoints) if endpoints else []
        models = fleet.models.state(endpoints) if fleet.models is not None else {}  # None: unknown, serves any
        rows = []
        for ep, load in zip(endpoints, loaded):
            st = loads.fresh_stats(ep)
            rows.append({"endpoint": ep, "load": load, "inflight": loads.count(ep),
                         "routing_health": asdict(fleet.health.view(ep)),
                         "instance_id": bridge.instance_for(ep), "models": models.get(ep),
                         "scraped": None if st is None else {"running": st.running, "waiting": st.waiting,
                                                             "kv_usage": st.kv_usage,
                                                             "kv_capacity_tokens": st.kv_capacity_tokens}})
        reason = process.readiness.reason()
        return {"ready": not reason, "not_ready_reason": reason, "tasks": process.tasks(),
                "open_streams": process.streams.open_streams, "streams_by_mode": dict(process.streams.modes),
                "inflight": loads.snapshot(), "inflight_total": loads.total(), "endpoints": rows,
                "instance_map": bridge.mapping(), "config": process.settings(),
                "prefix": prefix.sources.state(), "fleet_kv_capacity_tokens": loads.kv_capacity_tokens(),
                "working_set": None if prefix.working_set is None else prefix.working_set.state(),
                "queued_prefixes": None if prefix.queued is None else prefix.queued.state(),
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
