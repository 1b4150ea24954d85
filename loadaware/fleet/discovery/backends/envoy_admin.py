"""`envoy-admin`: the fleet is an Envoy cluster's hosts, polled from Envoy's admin API (discovery/envoy_admin.py)."""

from __future__ import annotations

from dataclasses import dataclass

from loadaware.fleet.discovery.envoy_admin import EnvoyAdminDiscovery
from loadaware.fleet.discovery.spec import Backend, DiscoveryContext, Task

ENVOY_ADMIN_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class EnvoyAdminOptions:
    envoy_admin_url: str = ""
    envoy_cluster: str = "engines"
    discovery_interval_s: float = 1.0


def _build(o: EnvoyAdminOptions, context: DiscoveryContext) -> list[tuple[str, Task]]:
    source = EnvoyAdminDiscovery(o.envoy_admin_url, o.envoy_cluster, context.catalog, context.metrics,
                                 o.discovery_interval_s, ENVOY_ADMIN_TIMEOUT_S)
    return [("discovery-envoy-admin", source.run)]


def _check(o: EnvoyAdminOptions) -> str | None:
    return None if o.envoy_admin_url else "--envoy-admin-url: --discovery envoy-admin needs Envoy's admin address"


ENVOY_ADMIN = Backend("envoy-admin", _build, EnvoyAdminOptions, finds_endpoints=True, check=_check)
