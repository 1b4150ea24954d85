"""Prometheus metrics of endpoint discovery, registered on the sidecar's one registry.

Kept beside the discovery sources (telemetry/metrics.py declares the routing metrics) so a discovery
source is added or changed in one place.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from loadaware.fleet.discovery.catalog import DiscoveredEndpoint

HEALTH_STATES = ("HEALTHY", "DEGRADED", "UNHEALTHY", "DRAINING")


class DiscoveryMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.updates = Counter("loadaware_discovery_updates", "Endpoint sets applied from discovery, by source",
                               ["source"], registry=registry)
        self.errors = Counter("loadaware_discovery_errors", "Discovery failures (the last good set stays), "
                              "by source and reason", ["source", "reason"], registry=registry)
        self.watch_restarts = Counter("loadaware_discovery_watch_restarts",
                                      "Kubernetes watch restarts, by how (resume: from the last resourceVersion; "
                                      "relist: after 410 Gone or at start)", ["how"], registry=registry)
        self.discovered = Gauge("loadaware_discovery_endpoints", "Endpoints discovery reports, by health",
                                ["source", "health"], registry=registry)

    def applied(self, source: str, reports: Iterable[DiscoveredEndpoint]) -> None:
        self.updates.labels(source).inc()
        counts = dict.fromkeys(HEALTH_STATES, 0)
        for report in reports:
            counts[report.health] = counts.get(report.health, 0) + 1
        for health, n in counts.items():
            self.discovered.labels(source, health).set(n)

    def error(self, source: str, reason: str) -> None:
        self.errors.labels(source, reason).inc()

    def watch_restart(self, how: str) -> None:
        self.watch_restarts.labels(how).inc()
