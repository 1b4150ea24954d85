"""What discovery knows about each endpoint, and the one place that turns it into the routable fleet.

Every discovery source (Envoy admin, Kubernetes EndpointSlices, InferencePool) reports a full list of endpoints;
the catalog keeps it for ListEndpoints and hands the routable subset to the EndpointRegistry. An endpoint
that vanishes or stops being routable leaves the registry at once, whose removal listeners release its
in-flight counts and end its LMCache credit. Static and file discovery feed the registry directly and
appear here with their source name and no health information.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from loadaware.fleet.registry import EndpointRegistry

log = logging.getLogger(__name__)

HEALTHY, DEGRADED, UNHEALTHY, DRAINING = "HEALTHY", "DEGRADED", "UNHEALTHY", "DRAINING"
ROUTABLE = frozenset((HEALTHY, DEGRADED))
# When two reports name one address (an EndpointSlice mid-move), the most routable one wins.
_RANK = {HEALTHY: 0, DEGRADED: 1, DRAINING: 2, UNHEALTHY: 3}


@dataclass(frozen=True, slots=True)
class DiscoveredEndpoint:
    endpoint: str  # HOST:PORT exactly as Envoy's engines cluster names the host
    health: str = HEALTHY
    detail: str = ""  # why it is not healthy, e.g. failed_active_health_check, terminating
    instance_id: str = ""  # LMCache instance id when discovery knows it (Kubernetes: the pod name)
    pod: str = ""
    zone: str = ""

    @property
    def routable(self) -> bool:
        return self.health in ROUTABLE


def merge(reports: Iterable[DiscoveredEndpoint]) -> list[DiscoveredEndpoint]:
    """One entry per address, first-seen order, the most routable report winning."""
    best: dict[str, DiscoveredEndpoint] = {}
    for report in reports:
        current = best.get(report.endpoint)
        if current is None or _RANK.get(report.health, 9) < _RANK.get(current.health, 9):
            best[report.endpoint] = report
    return list(best.values())


def instance_ids(entries: Iterable[DiscoveredEndpoint]) -> dict[str, str]:
    """instance id -> endpoint for routable entries that carry one."""
    return {e.instance_id: e.endpoint for e in entries if e.routable and e.instance_id}


InstanceIdsListener = Callable[[Mapping[str, str]], None]


class DiscoveryCatalog:
    def __init__(self, source: str, registry: EndpointRegistry,
                 on_instance_ids: InstanceIdsListener | None = None) -> None:
        self.source = source
        self.registry = registry
        self.on_instance_ids = on_instance_ids
        self.updates = 0  # full reports applied (the first one makes the registry ready)
        self._entries: dict[str, DiscoveredEndpoint] = {}
        self._ids: dict[str, str] = {}

    def apply(self, reports: Iterable[DiscoveredEndpoint]) -> None:
        entries = merge(reports)
        self._entries = {e.endpoint: e for e in entries}
        ids = instance_ids(entries)
        if ids != self._ids:
            # Before the registry changes, so credit for a new pod's instance id is there as it joins.
            self._ids = ids
            if self.on_instance_ids is not None:
                self.on_instance_ids(dict(ids))
        before = self.registry.snapshot()
        self.registry.set([e.endpoint for e in entries if e.routable])
        self.updates += 1
        if self.registry.snapshot() != before:
            unroutable = [f"{e.endpoint}({e.health.lower()}{':' + e.detail if e.detail else ''})"
                          for e in entries if not e.routable]
            log.info("%s discovery: %d routable, not routable: %s", self.source, len(self.registry.snapshot()),
                     ", ".join(unroutable) or "none")

    def entry(self, endpoint: str) -> DiscoveredEndpoint:
        """What discovery says about an endpoint; a registry member with no report is plainly healthy."""
        return self._entries.get(endpoint) or DiscoveredEndpoint(endpoint)

    def pod(self, endpoint: str) -> str:
        """The endpoint's pod name, "" when discovery names none (no entry made: /metrics asks for every one)."""
        e = self._entries.get(endpoint)
        return "" if e is None else e.pod

    def entries(self) -> list[DiscoveredEndpoint]:
        """Routable endpoints in registry order, then the ones discovery reports but routing skips."""
        routable = self.registry.snapshot()
        listed = [self.entry(ep) for ep in routable]
        members = set(routable)
        listed += [e for ep, e in self._entries.items() if ep not in members]
        return listed
