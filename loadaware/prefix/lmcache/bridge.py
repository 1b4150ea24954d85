"""Which endpoint an LMCache instance id stands for. Pure bookkeeping: the I/O lives in client.py.

Rules (docs/architecture.md, "Invariants": never over-credit): only live instance ids earn credit; an
unknown id earns none and asks for a refresh; when two ids point at one endpoint (an engine restarted
under a new id while the old one lingers in the controller), only the most recently registered is live;
an id missing from a complete worker list is dead. An explicit --lmcache-instance-map entry is
authoritative.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from loadaware.fleet.addresses import canonical_host, host_of


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    instance_id: str
    ip: str
    registration_time: float = 0.0

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> WorkerRecord:
        return cls(str(data["instance_id"]), str(data.get("ip", "")),
                   float(data.get("registration_time") or 0.0))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Credit:
    matches: dict[str, int]  # endpoint -> matched prompt tokens
    unknown_ids: tuple[str, ...]  # holders we could not map: worth a refresh
    ignored_ids: tuple[str, ...]  # known but dead or outside the fleet: no credit, no refresh


def _host(endpoint: str) -> str:
    try:
        return host_of(endpoint)
    except ValueError:
        return ""  # not an address (nothing any worker's ip could match)


class InstanceBridge:
    def __init__(self, explicit: Mapping[str, str] | None = None) -> None:
        self.explicit = dict(explicit or {})
        self._workers: dict[str, WorkerRecord] = {}  # every instance id the controller told us about
        self._dead: set[str] = set()
        self._live_map: dict[str, str] = {}  # live instance id -> endpoint (explicit + discovered)
        self._endpoint_ids: dict[str, str] = {}  # endpoint -> its live instance id
        self._endpoints: tuple[str, ...] = ()
        self._rebuild()

    # ---- updates ----
    def set_endpoints(self, endpoints: Iterable[str]) -> None:
        self._endpoints = tuple(endpoints)
        self._rebuild()

    def apply_workers(self, workers: Iterable[WorkerRecord], complete: bool,
                      queried_ids: Iterable[str] = ()) -> None:
        """Fold in a worker-info answer. complete=True: the list is every registered instance, so anyone
        missing is dead. queried_ids: ids asked for by name; any that came back empty are dead."""
        workers = list(workers)
        seen = {w.instance_id for w in workers}
        if complete:
            self._dead |= set(self._workers) - seen
            self._workers = {}
        for worker in workers:
            self._workers[worker.instance_id] = worker
            self._dead.discard(worker.instance_id)
        for instance_id in queried_ids:
            if instance_id not in seen:
                self._workers.pop(instance_id, None)
                self._dead.add(instance_id)
        self._rebuild()

    def _rebuild(self) -> None:
        by_host: dict[str, list[str]] = {}
        for endpoint in self._endpoints:
            by_host.setdefault(_host(endpoint), []).append(endpoint)
        newest: dict[str, WorkerRecord] = {}
        for worker in self._workers.values():
            if worker.instance_id in self.explicit:
                continue
            # the worker's ip as LMCache reports it, in the endpoints' canonical form (IPv6 compressed)
            candidates = by_host.get(canonical_host(worker.ip.strip().strip("[]")), [])
            if len(candidates) != 1:
                continue  # no endpoint on that ip, or several (needs the explicit map)
            endpoint = candidates[0]
            current = newest.get(endpoint)
            if current is None or worker.registration_time > current.registration_time:
                newest[endpoint] = worker
        live_map = {w.instance_id: ep for ep, w in newest.items()}
        for instance_id, endpoint in self.explicit.items():
            live_map[instance_id] = endpoint
        self._live_map = live_map
        self._endpoint_ids = {ep: iid for iid, ep in live_map.items()}

    # ---- queries (hot path: dictionary work only) ----
    def credit(self, layout: Mapping[str, int], endpoints: tuple[str, ...]) -> Credit:
        matches: dict[str, int] = {}
        unknown: list[str] = []
        ignored: list[str] = []
        for instance_id, matched in layout.items():
            endpoint = self._live_map.get(instance_id)
            if endpoint is None:
                (ignored if instance_id in self._dead or instance_id in self._workers else unknown).append(instance_id)
                continue
            if endpoint not in endpoints:
                ignored.append(instance_id)
                continue
            if matched > matches.get(endpoint, 0):
                matches[endpoint] = matched
        return Credit(matches, tuple(unknown), tuple(ignored))

    def instance_for(self, endpoint: str) -> str | None:
        return self._endpoint_ids.get(endpoint)

    def unmapped(self, endpoints: Iterable[str]) -> list[str]:
        return [ep for ep in endpoints if ep not in self._endpoint_ids]

    def mapping(self) -> dict[str, str]:
        return dict(self._live_map)
