"""Kubernetes discovery: the EndpointSlices of one Service, listed then watched, resumed after drops.

Each ready endpoint becomes HOST:PORT (the port named --k8s-port-name, as Envoy's cluster names the host)
and carries its pod name as the LMCache instance id, LMCache's default, so credit needs no ip guessing.
Pure parts: slice_endpoints() and SliceSet. I/O: KubernetesDiscovery, on the `kubernetes` client's asyncio
API (kubernetes.aio), so neither the list nor the long-lived watch ever blocks the event loop.
The Service's slices are followed by list-then-watch (listwatch.py: resumed after drops, re-listed after
410 Gone); the last good set stays while the API server is unreachable.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loadaware.fleet.addresses import endpoint_of
from loadaware.fleet.discovery.catalog import DRAINING, HEALTHY, UNHEALTHY, DiscoveredEndpoint, DiscoveryCatalog
from loadaware.fleet.discovery.listwatch import LIST_WATCH_TIMING, Collection, ListWatch, WatchTiming
from loadaware.fleet.discovery.metrics import DiscoveryMetrics

log = logging.getLogger(__name__)

SOURCE = "kubernetes"
SERVICE_LABEL = "kubernetes.io/service-name"
IN_CLUSTER_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


# ---- pure mapping --------------------------------------------------------------------------------------

def slice_port(slice_: Mapping[str, Any], port_name: str) -> int | None:
    """The port of `port_name` in this slice; with no name given, the slice's only (or first) port."""
    ports = [p for p in slice_.get("ports") or [] if isinstance(p, Mapping) and p.get("port")]
    if port_name:
        ports = [p for p in ports if p.get("name") == port_name]
    return int(ports[0]["port"]) if ports else None


def endpoint_health(conditions: Mapping[str, Any] | None) -> tuple[str, str]:
    """EndpointConditions: a nil `ready` means ready, a nil `terminating` means not terminating."""
    conditions = conditions or {}
    if conditions.get("terminating") is True:
        return DRAINING, "terminating"
    if conditions.get("ready") is False:
        return UNHEALTHY, "not_ready"
    return HEALTHY, ""


def slice_endpoints(slice_: Mapping[str, Any], port_name: str) -> list[DiscoveredEndpoint]:
    if slice_.get("addressType", "IPv4") not in ("IPv4", "IPv6"):
        return []  # FQDN slices name no address Envoy's cluster could hold
    port = slice_port(slice_, port_name)
    if port is None:
        return []
    out: list[DiscoveredEndpoint] = []
    for ep in slice_.get("endpoints") or []:
        health, detail = endpoint_health(ep.get("conditions"))
        ref = ep.get("targetRef") or {}
        pod = str(ref.get("name", "")) if ref.get("kind", "Pod") == "Pod" else ""
        for address in ep.get("addresses") or []:
            try:  # IPv6 slices name bare addresses; the endpoint brackets them
                endpoint = endpoint_of(str(address), port)
            except ValueError:
                continue
            out.append(DiscoveredEndpoint(endpoint, health, detail, instance_id=pod, pod=pod,
                                          zone=str(ep.get("zone") or "")))
    return out


class SliceSet:
    """The current EndpointSlices of the Service, by name, folded from a list and watch events."""

    def __init__(self, port_name: str) -> None:
        self.port_name = port_name
        self._slices: dict[str, Mapping[str, Any]] = {}

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._slices = {_name(s): s for s in items}

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Fold one watch event in; True when the endpoint set may have changed."""
        if event_type in ("ADDED", "MODIFIED"):
            self._slices[_name(obj)] = obj
            return True
        if event_type == "DELETED":
            return self._slices.pop(_name(obj), None) is not None
        return False  # BOOKMARK: only the resourceVersion moves

    def endpoints(self) -> list[DiscoveredEndpoint]:
        out: list[DiscoveredEndpoint] = []
        for name in sorted(self._slices):  # stable order whatever order the API server answered in
            out.extend(slice_endpoints(self._slices[name], self.port_name))
        return out

    def __len__(self) -> int:
        return len(self._slices)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def default_namespace() -> str:
    """The pod's own namespace in a cluster, else "default" (kubectl's rule)."""
    try:
        with open(IN_CLUSTER_NAMESPACE_FILE, encoding="utf-8") as fh:
            return fh.read().strip() or "default"
    except OSError:
        return "default"


# ---- I/O -----------------------------------------------------------------------------------------------

async def make_api_client(kubeconfig: str = "") -> Any:
    """In a pod: the service account. Else a kubeconfig (the given path, or ~/.kube/config)."""
    from kubernetes.aio import client, config

    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    return await config.new_client_from_config(config_file=kubeconfig or None)


ApiClientFactory = Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class ServiceRef:
    """The engines' Service: its namespace, its name, and the port Envoy sends to ("": its only port)."""

    namespace: str
    name: str
    port_name: str = ""


class KubernetesDiscovery:
    name = SOURCE

    def __init__(self, service: ServiceRef, catalog: DiscoveryCatalog, metrics: DiscoveryMetrics,
                 client_factory: ApiClientFactory, timing: WatchTiming = LIST_WATCH_TIMING) -> None:
        self.namespace = service.namespace
        self.service = service.name
        self.selector = f"{SERVICE_LABEL}={service.name}"
        self.slices = SliceSet(service.port_name)
        self.catalog = catalog
        self.metrics = metrics
        self.client_factory = client_factory
        self.timing = timing
        self.follower: ListWatch | None = None

    @property
    def resource_version(self) -> str | None:
        return self.follower.resource_version if self.follower is not None else None

    async def run(self) -> None:
        from kubernetes.aio import client

        api_client = await self.client_factory()
        api = client.DiscoveryV1Api(api_client)
        collection = Collection("endpointslices", api.list_namespaced_endpoint_slice_without_preload_content,
                                api.list_namespaced_endpoint_slice, self.namespace, self.selector)
        self.follower = ListWatch(collection, self.slices, self._publish, self.metrics, self._failed, self.timing)
        try:
            await self.follower.run()
        finally:
            await api_client.close()

    def _failed(self, exc: Exception, retry_s: float) -> None:
        self.metrics.error(SOURCE, type(exc).__name__)
        log.warning("kubernetes discovery of %s/%s failed (%s: %s); retrying in %.1fs from resourceVersion %s",
                    self.namespace, self.service, type(exc).__name__, exc, retry_s, self.resource_version)

    def _publish(self) -> None:
        endpoints = self.slices.endpoints()
        self.catalog.apply(endpoints)
        self.metrics.applied(SOURCE, endpoints)
