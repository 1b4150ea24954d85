"""Kubernetes discovery: the EndpointSlices of one Service, listed then watched, resumed after drops.

Each ready endpoint becomes HOST:PORT (the port named --k8s-port-name, as Envoy's cluster names the host)
and carries its pod name as the LMCache instance id, LMCache's default, so credit needs no ip guessing.
Pure parts: slice_endpoints() and SliceSet. I/O: KubernetesDiscovery, on the `kubernetes` client's asyncio
API (kubernetes.aio), so neither the list nor the long-lived watch ever blocks the event loop.

Watch protocol (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes):
list -> resourceVersion R; watch from R; every event (and BOOKMARK) advances R. A dropped connection
resumes the watch from the last R, so nothing is missed and nothing is re-listed; 410 Gone (R compacted
away) means re-list. The last good set stays while the API server is unreachable.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from loadaware.fleet.addresses import endpoint_of
from loadaware.fleet.discovery.catalog import DRAINING, HEALTHY, UNHEALTHY, DiscoveredEndpoint, DiscoveryCatalog
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

class Gone(Exception):
    """410: the resourceVersion we hold was compacted away; only a fresh list helps."""


class ListWatcher(Protocol):
    """A source that lists a collection, then watches it from the list's resourceVersion."""

    resource_version: str | None
    _progress: bool  # the current watch delivered something: its failure is not a pattern

    async def _list(self, api: Any) -> None: ...

    async def _watch(self, api: Any) -> None: ...


async def list_then_watch(source: ListWatcher, api: Any, backoff_s: tuple[float, float],
                          failed: Callable[[Exception, float], None]) -> None:
    """List (when there is no resourceVersion to resume from), then watch, forever. A watch the server ends
    (its timeout) resumes at once; 410 Gone re-lists; any other failure keeps the last fleet, is reported to
    `failed` and retried with exponential backoff (from the start again after a watch that worked)."""
    delay = backoff_s[0]
    while True:
        try:
            if source.resource_version is None:
                await source._list(api)
            await source._watch(api)
            delay = backoff_s[0]
        except Gone:
            log.info("discovery: resourceVersion %s expired; re-listing", source.resource_version)
            source.resource_version = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the API server being away keeps the last fleet
            if source._progress:
                delay = backoff_s[0]
            failed(exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, backoff_s[1])


async def watch_events(watch: Any, list_call: Any, namespace: str, label_selector: str,
                       resource_version: str | None, timeout_s: float) -> AsyncIterator[dict[str, Any]]:
    """One watch of `list_call` from `resource_version`: its events, each checked to be one; the server's
    410 (the version is too old) raised as Gone; the watch closed however it ends."""
    from kubernetes.aio.client.exceptions import ApiException

    try:
        stream = watch.stream(list_call, namespace, label_selector=label_selector,
                              resource_version=resource_version, allow_watch_bookmarks=True,
                              timeout_seconds=timeout_s, _request_timeout=float(timeout_s + 30))
        async for event in stream:
            if not isinstance(event, dict) or "type" not in event:
                raise RuntimeError(f"unexpected watch line {str(event)[:200]!r}")
            yield event
    except ApiException as exc:
        if exc.status == 410:
            raise Gone() from None
        raise
    finally:
        await watch.close()


async def make_api_client(kubeconfig: str = "") -> Any:
    """In a pod: the service account. Else a kubeconfig (the given path, or ~/.kube/config)."""
    from kubernetes.aio import client, config

    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    return await config.new_client_from_config(config_file=kubeconfig or None)


ApiClientFactory = Callable[[], Awaitable[Any]]


class KubernetesDiscovery:
    name = SOURCE

    def __init__(self, namespace: str, service: str, port_name: str, catalog: DiscoveryCatalog,
                 metrics: DiscoveryMetrics, client_factory: ApiClientFactory,
                 watch_timeout_s: int = 290, backoff_s: tuple[float, float] = (0.5, 15.0)) -> None:
        self.namespace = namespace
        self.service = service
        self.selector = f"{SERVICE_LABEL}={service}"
        self.slices = SliceSet(port_name)
        self.catalog = catalog
        self.metrics = metrics
        self.client_factory = client_factory
        # Server-side watch timeout: the API server ends the watch cleanly and we resume; it also bounds
        # how long a silently dead connection can go unnoticed.
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.resource_version: str | None = None
        self.lists = 0
        self.watches = 0
        self._progress = False  # the current connection delivered something: its failure is not a pattern

    async def run(self) -> None:
        from kubernetes.aio import client

        api_client = await self.client_factory()
        api = client.DiscoveryV1Api(api_client)
        try:
            await list_then_watch(self, api, self.backoff_s, self._failed)
        finally:
            await api_client.close()

    def _failed(self, exc: Exception, retry_s: float) -> None:
        self.metrics.error(SOURCE, type(exc).__name__)
        log.warning("kubernetes discovery of %s/%s failed (%s: %s); retrying in %.1fs from resourceVersion %s",
                    self.namespace, self.service, type(exc).__name__, exc, retry_s, self.resource_version)

    async def _list(self, api: Any) -> None:
        items: list[Mapping[str, Any]] = []
        token: str | None = None
        while True:
            resp = await api.list_namespaced_endpoint_slice_without_preload_content(
                self.namespace, label_selector=self.selector, limit=500, _continue=token,
                _request_timeout=30.0)
            try:
                body = await _json_body(resp)
            finally:
                resp.release()
            items.extend(body.get("items") or [])
            metadata = body.get("metadata") or {}
            token = metadata.get("continue") or None
            if token is None:
                break
        self.slices.replace(items)
        self._progress = True
        self.resource_version = str(metadata.get("resourceVersion") or "") or None
        self.lists += 1
        self.metrics.watch_restart("relist")
        self._publish()

    async def _watch(self, api: Any) -> None:
        from kubernetes.aio.watch import Watch

        self.watches += 1
        self._progress = False
        if self.watches > 1:
            self.metrics.watch_restart("resume")
        watch = Watch()
        async for event in watch_events(watch, api.list_namespaced_endpoint_slice, self.namespace, self.selector,
                                        self.resource_version, self.watch_timeout_s):
            self._progress = True
            if watch.resource_version:
                self.resource_version = str(watch.resource_version)
            if self.slices.apply(event["type"], event["raw_object"]):
                self._publish()

    def _publish(self) -> None:
        endpoints = self.slices.endpoints()
        self.catalog.apply(endpoints)
        self.metrics.applied(SOURCE, endpoints)


async def _json_body(resp: Any) -> dict[str, Any]:
    raw = await resp.read()
    if resp.status == 410:
        raise Gone()
    if resp.status != 200:
        raise RuntimeError(f"list endpointslices: HTTP {resp.status}: {raw[:200]!r}")
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise RuntimeError("list endpointslices: not a JSON object")
    return body
