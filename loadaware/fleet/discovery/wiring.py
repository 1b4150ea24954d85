"""Builds the discovery source that --discovery names and connects it to the fleet.

static and file feed the EndpointRegistry directly (sidecar/sources/endpoints.py); envoy-admin and
kubernetes report through a DiscoveryCatalog, which also keeps what ListEndpoints shows (health, pod,
zone). Pod names from Kubernetes become LMCache instance ids next to --lmcache-instance-map.
"""

from __future__ import annotations

from typing import Any, Callable, Coroutine, Mapping

from prometheus_client import CollectorRegistry

from loadaware.config import Settings
from loadaware.fleet.discovery.catalog import DiscoveryCatalog
from loadaware.fleet.discovery.envoy_admin import EnvoyAdminDiscovery
from loadaware.fleet.discovery.kubernetes import KubernetesDiscovery, default_namespace, make_api_client
from loadaware.fleet.discovery.metrics import DiscoveryMetrics
from loadaware.fleet.registry import EndpointRegistry
from loadaware.prefix.lmcache.bridge import InstanceBridge

ENVOY_ADMIN_TIMEOUT_S = 2.0


class Discovery:
    def __init__(self, settings: Settings, registry: EndpointRegistry, bridge: InstanceBridge,
                 metrics_registry: CollectorRegistry) -> None:
        self.mode = settings.discovery_mode
        self.registry = registry
        self.bridge = bridge
        self.explicit_ids = dict(settings.lmcache_instance_map)
        self.metrics = DiscoveryMetrics(metrics_registry)
        self.catalog = DiscoveryCatalog(self.mode, registry, on_instance_ids=self._instance_ids)
        self.source: EnvoyAdminDiscovery | KubernetesDiscovery | None = None
        if self.mode == "envoy-admin":
            self.source = EnvoyAdminDiscovery(settings.envoy_admin_url, settings.envoy_cluster, self.catalog,
                                              self.metrics, settings.discovery_interval_s, ENVOY_ADMIN_TIMEOUT_S)
        elif self.mode == "kubernetes":
            kubeconfig = settings.kubeconfig
            self.source = KubernetesDiscovery(settings.k8s_namespace or default_namespace(), settings.k8s_service,
                                              settings.k8s_port_name, self.catalog, self.metrics,
                                              lambda: make_api_client(kubeconfig))

    def _instance_ids(self, discovered: Mapping[str, str]) -> None:
        # The bridge's explicit map is authoritative: a pod name is the instance id LMCache registers under
        # by default, so it needs no ip guessing. An explicit --lmcache-instance-map entry still wins.
        self.bridge.explicit = {**discovered, **self.explicit_ids}
        self.bridge.set_endpoints(self.registry.snapshot())  # rebuild the live map now, not on the next poll

    def tasks(self) -> list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]]:
        return [(f"discovery-{self.mode}", self.source.run)] if self.source is not None else []
