"""Envoy admin discovery: mirror the hosts and health of Envoy's engines cluster.

Envoy (static config, DNS, EDS, Istio) stays the single source of truth for which engines exist; the
sidecar names only hosts Envoy can route to, so override_host never silently falls back because the
sidecar picked a host Envoy does not have, and an unhealthy or ejected host gets no traffic from us.
Parsing is pure (parse_cluster_hosts); EnvoyAdminDiscovery only polls `GET /clusters?format=json`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from loadaware.fleet.addresses import endpoint_of
from loadaware.fleet.discovery.catalog import (
    DEGRADED,
    DRAINING,
    HEALTHY,
    UNHEALTHY,
    DiscoveredEndpoint,
    DiscoveryCatalog,
)
from loadaware.fleet.discovery.metrics import DiscoveryMetrics

log = logging.getLogger(__name__)

SOURCE = "envoy-admin"
# Envoy's admin reports only the flags that are set (HostHealthStatus in admin/v3/clusters.proto).
_DRAINING_FLAGS = ("pending_dynamic_removal",)
_UNHEALTHY_FLAGS = ("failed_active_health_check", "failed_outlier_check", "excluded_via_immediate_hc_fail",
                    "active_hc_timeout", "pending_active_hc")
_DEGRADED_FLAGS = ("failed_active_degraded_check",)
_EDS_HEALTH = {"HEALTHY": HEALTHY, "UNKNOWN": HEALTHY, "DEGRADED": DEGRADED, "UNHEALTHY": UNHEALTHY,
               "TIMEOUT": UNHEALTHY, "DRAINING": DRAINING}


class ClusterNotFound(LookupError):
    pass


def host_health(status: Mapping[str, Any]) -> tuple[str, str]:
    """(health, detail) of one host from its admin `health_status` object."""
    for flag in _DRAINING_FLAGS:
        if status.get(flag):
            return DRAINING, flag
    for flag in _UNHEALTHY_FLAGS:
        if status.get(flag):
            return UNHEALTHY, flag
    eds = str(status.get("eds_health_status", "HEALTHY"))
    health = _EDS_HEALTH.get(eds, UNHEALTHY)
    if health != HEALTHY:
        return health, f"eds_health_status={eds}"
    for flag in _DEGRADED_FLAGS:
        if status.get(flag):
            return DEGRADED, flag
    return HEALTHY, ""


def parse_cluster_hosts(clusters: Mapping[str, Any], cluster: str) -> list[DiscoveredEndpoint]:
    """The hosts of `cluster` in an admin `/clusters?format=json` answer. Raises ClusterNotFound."""
    for status in clusters.get("cluster_statuses", []):
        if status.get("name") != cluster:
            continue
        out: list[DiscoveredEndpoint] = []
        for host in status.get("host_statuses", []):
            socket_address = host.get("address", {}).get("socket_address")
            if not socket_address or "port_value" not in socket_address:
                continue  # a pipe or internal address is nothing an HTTP header can name
            try:  # IPv6 bracketed, as Envoy's override_host names its hosts
                endpoint = endpoint_of(str(socket_address.get("address", "")), int(socket_address["port_value"]))
            except (TypeError, ValueError):
                continue  # nothing a destination header could name
            health, detail = host_health(host.get("health_status", {}))
            zone = str(host.get("locality", {}).get("zone", ""))
            out.append(DiscoveredEndpoint(endpoint, health, detail, zone=zone))
        return out
    names = [s.get("name", "?") for s in clusters.get("cluster_statuses", [])]
    raise ClusterNotFound(f"cluster {cluster!r} not in Envoy's clusters ({', '.join(names[:20]) or 'none'})")


class EnvoyAdminDiscovery:
    """Polls Envoy's admin API. On failure the last good set stays: Envoy being briefly unreachable (a
    restart) must not empty the fleet, and without Envoy there is no traffic to route anyway."""

    name = SOURCE

    def __init__(self, admin_url: str, cluster: str, catalog: DiscoveryCatalog, metrics: DiscoveryMetrics,
                 interval_s: float, timeout_s: float) -> None:
        self.url = admin_url.rstrip("/") + "/clusters?format=json"
        self.cluster = cluster
        self.catalog = catalog
        self.metrics = metrics
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._last_error = ""

    async def poll_once(self, session: aiohttp.ClientSession) -> bool:
        try:
            async with asyncio.timeout(self.timeout_s):
                async with session.get(self.url) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}")
                    raw = await resp.read()
            # A mesh gateway's answer can be megabytes: parse it off the event loop.
            body = json.loads(raw) if len(raw) < 262144 else await asyncio.to_thread(json.loads, raw)
            hosts = parse_cluster_hosts(body, self.cluster)
        except Exception as exc:  # noqa: BLE001 - any failure keeps the last good set
            reason = ("timeout" if isinstance(exc, (TimeoutError, asyncio.TimeoutError)) else
                      "cluster_not_found" if isinstance(exc, ClusterNotFound) else "error")
            self.metrics.error(SOURCE, reason)
            message = f"{reason}: {exc}"
            if message != self._last_error:  # log a persistent failure once, not every second
                log.warning("envoy-admin discovery (%s) failed, keeping the last set: %s", self.url, message)
                self._last_error = message
            return False
        if self._last_error:
            log.info("envoy-admin discovery recovered")
            self._last_error = ""
        self.catalog.apply(hosts)
        self.metrics.applied(SOURCE, hosts)
        return True

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            while True:
                await self.poll_once(session)
                await asyncio.sleep(self.interval_s)
