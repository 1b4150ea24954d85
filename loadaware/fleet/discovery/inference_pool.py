"""InferencePool discovery: the engines are the pods a Gateway API Inference Extension InferencePool selects.

The sidecar runs as the pool's endpoint picker (the pool's spec.endpointPickerRef names its Service); the
gateway routes to whatever `ip:port` the picker answers. So the fleet is what the pool says it is:
spec.selector.matchLabels picks the pods in the pool's namespace, spec.targetPorts the ports, and every
Ready pod is one endpoint per target port, `podIP:port` (the address the gateway's override-host cluster
holds). A pod that is not Ready is reported UNHEALTHY, one being deleted DRAINING; neither gets traffic.
Each pod name is its LMCache instance id (LMCache's default), as with EndpointSlice discovery; with more
than one target port a pod holds several engines and its name identifies none of them, so no id is given.

Pure parts: pool_spec(), pod_health(), pod_endpoints(), PodSet. I/O: InferencePoolDiscovery, on the
`kubernetes` client's asyncio API (kubernetes.aio): the pool is read (custom object API) at start and
again every `pool_interval_s`; the pods are listed then watched with the pool's selector, a dropped watch
resumes from its resourceVersion and 410 Gone re-lists (the protocol kubernetes.py describes). When the
pool's selector or ports change, the pod watch restarts with the new selector and the fleet follows. Every
call has a time box; while the API server fails, the last good fleet stays and each failure is counted in
loadaware_discovery_errors_total{source="inference-pool"}.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loadaware.fleet.addresses import endpoint_of
from loadaware.fleet.discovery.catalog import DRAINING, HEALTHY, UNHEALTHY, DiscoveredEndpoint, DiscoveryCatalog
from loadaware.fleet.discovery.kubernetes import ApiClientFactory
from loadaware.fleet.discovery.listwatch import Collection, ListWatch, WatchTiming
from loadaware.fleet.discovery.metrics import DiscoveryMetrics

log = logging.getLogger(__name__)

SOURCE = "inference-pool"
GROUP = "inference.networking.k8s.io"
VERSION = "v1"
PLURAL = "inferencepools"
# What this source asks of the API server, in its own namespace: (API group, resource, verbs). The picker's
# Role must grant at least this (k8s/inference-pool/pool/picker-rbac.yaml; tests/k8s checks it).
API_CALLS = ((GROUP, PLURAL, ("get",)), ("", "pods", ("list", "watch")))


# ---- pure mapping --------------------------------------------------------------------------------------

class InvalidPool(ValueError):
    """The InferencePool names no pods or no ports this discovery could use."""


class PoolNotFound(Exception):
    """The InferencePool does not exist (404)."""


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What discovery needs of an InferencePool: its pod selector and its target ports."""

    match_labels: tuple[tuple[str, str], ...]  # sorted (key, value) pairs
    ports: tuple[int, ...]  # in the pool's order, no duplicates

    @property
    def label_selector(self) -> str:
        """The selector as the API's labelSelector parameter: k=v,k=v (matchLabels is an AND)."""
        return ",".join(f"{k}={v}" for k, v in self.match_labels)

    def selects(self, labels: Mapping[str, Any] | None) -> bool:
        labels = labels or {}
        return all(labels.get(k) == v for k, v in self.match_labels)


def pool_spec(pool: Mapping[str, Any]) -> PoolSpec:
    """The selector and target ports of an InferencePool object (inference.networking.k8s.io/v1)."""
    spec = pool.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidPool("no spec")
    selector = spec.get("selector")
    labels = selector.get("matchLabels") if isinstance(selector, Mapping) else None
    if not isinstance(labels, Mapping) or not labels:
        # The CRD requires at least one label; an empty selector would take every pod in the namespace.
        raise InvalidPool("spec.selector.matchLabels is empty")
    ports: list[int] = []
    for item in spec.get("targetPorts") or []:
        number = item.get("number") if isinstance(item, Mapping) else None
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 65535:
            raise InvalidPool(f"spec.targetPorts: {item!r} is not a port number")
        if number not in ports:
            ports.append(number)
    if not ports:
        raise InvalidPool("spec.targetPorts is empty")
    return PoolSpec(tuple(sorted((str(k), str(v)) for k, v in labels.items())), tuple(ports))


def pod_health(pod: Mapping[str, Any]) -> tuple[str, str]:
    """HEALTHY when the pod's Ready condition is True; DRAINING once it is being deleted (it may still
    report Ready while it drains); UNHEALTHY otherwise (starting, failing its probes, finished)."""
    metadata = pod.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return DRAINING, "terminating"
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "")
    if phase in ("Succeeded", "Failed"):
        return UNHEALTHY, phase.lower()
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return (HEALTHY, "") if condition.get("status") == "True" else (UNHEALTHY, "not_ready")
    return UNHEALTHY, "not_ready"  # no Ready condition yet: not scheduled or still starting


def pod_endpoints(pod: Mapping[str, Any], ports: Iterable[int]) -> list[DiscoveredEndpoint]:
    """One endpoint per target port on the pod's ip; a pod with no ip yet names no address."""
    status = pod.get("status") or {}
    address = str(status.get("podIP") or "")
    if not address:
        return []
    ports = tuple(ports)
    health, detail = pod_health(pod)
    name = _name(pod)
    instance_id = name if len(ports) == 1 else ""
    try:  # an IPv6 podIP is bracketed in the endpoint
        return [DiscoveredEndpoint(endpoint_of(address, port), health, detail,
                                   instance_id=instance_id, pod=name) for port in ports]
    except ValueError:
        return []  # no address a destination header could name


class PodSet:
    """The pods the pool selects, by name, folded from a list and watch events."""

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self._pods: dict[str, Mapping[str, Any]] = {}

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._pods = {_name(p): p for p in items if self.spec.selects((p.get("metadata") or {}).get("labels"))}

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Fold one watch event in; True when the endpoint set may have changed."""
        name = _name(obj)
        if event_type in ("ADDED", "MODIFIED"):
            if self.spec.selects((obj.get("metadata") or {}).get("labels")):
                self._pods[name] = obj
                return True
            return self._pods.pop(name, None) is not None  # relabelled out of the pool
        if event_type == "DELETED":
            return self._pods.pop(name, None) is not None
        return False  # BOOKMARK: only the resourceVersion moves

    def endpoints(self) -> list[DiscoveredEndpoint]:
        out: list[DiscoveredEndpoint] = []
        for name in sorted(self._pods):  # stable order whatever order the API server answered in
            out.extend(pod_endpoints(self._pods[name], self.spec.ports))
        return out

    def __len__(self) -> int:
        return len(self._pods)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


# ---- I/O -----------------------------------------------------------------------------------------------

# One pool read or list page within 10 s; the pool's spec re-read every 5 s.
POOL_TIMING = WatchTiming(request_timeout_s=10.0, recheck_s=5.0)


class InferencePoolDiscovery:
    name = SOURCE

    def __init__(self, namespace: str, pool: str, catalog: DiscoveryCatalog, metrics: DiscoveryMetrics,
                 client_factory: ApiClientFactory, timing: WatchTiming = POOL_TIMING) -> None:
        self.namespace = namespace
        self.pool = pool
        self.catalog = catalog
        self.metrics = metrics
        self.client_factory = client_factory
        self.timing = timing
        self.pool_interval_s = timing.recheck_s  # how soon a change of the pool's selector or ports is seen
        self.request_timeout_s = timing.request_timeout_s  # time box of one pool read or one list page
        self.backoff_s = timing.backoff_s
        self.spec: PoolSpec | None = None
        self.pods: PodSet | None = None
        self.follower: ListWatch | None = None  # the pods of the current spec, listed then watched
        self.pool_reads = 0

    @property
    def resource_version(self) -> str | None:
        return self.follower.resource_version if self.follower is not None else None

    async def run(self) -> None:
        from kubernetes.aio import client

        api_client = await self.client_factory()
        core = client.CoreV1Api(api_client)
        custom = client.CustomObjectsApi(api_client)
        try:
            spec = await self._first_pool(custom)
            while True:
                self._adopt(spec)
                pods = asyncio.create_task(self._follow_pods(core), name=f"inference-pool-pods-{self.pool}")
                changed = asyncio.create_task(self._pool_change(custom, spec), name=f"inference-pool-{self.pool}")
                try:
                    done, _ = await asyncio.wait((pods, changed), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (pods, changed):
                        task.cancel()
                    await asyncio.gather(pods, changed, return_exceptions=True)
                if changed not in done:
                    pods.result()  # the pod follower never returns: re-raise what ended it
                    raise RuntimeError("inference-pool pod watch ended")
                spec = changed.result()
        finally:
            await api_client.close()

    # ---- the pool ----
    async def _first_pool(self, custom: Any) -> PoolSpec:
        """Read the pool until it can be read; no fleet is known before."""
        delay = self.backoff_s[0]
        while True:
            try:
                return await self._read_pool(custom)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - retried with backoff, counted
                self._failed("read", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_s[1])

    async def _pool_change(self, custom: Any, current: PoolSpec) -> PoolSpec:
        """Re-read the pool every pool_interval_s; return its spec once it differs from `current`. A failed
        read keeps the current spec (and the fleet), is counted, and is retried at the next interval."""
        while True:
            await asyncio.sleep(self.pool_interval_s)
            try:
                spec = await self._read_pool(custom)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the pool being unreadable keeps the last fleet
                self._failed("read", exc, self.pool_interval_s)
                continue
            if spec != current:
                log.info("inference pool %s/%s changed: selector %s -> %s, ports %s -> %s", self.namespace,
                         self.pool, current.label_selector, spec.label_selector, current.ports, spec.ports)
                return spec

    async def _read_pool(self, custom: Any) -> PoolSpec:
        async with asyncio.timeout(self.request_timeout_s):
            resp = await custom.get_namespaced_custom_object_without_preload_content(
                GROUP, VERSION, self.namespace, PLURAL, self.pool, _request_timeout=self.request_timeout_s)
            try:
                raw = await resp.read()
            finally:
                resp.release()
        if resp.status == 404:
            raise PoolNotFound(f"inferencepool {self.namespace}/{self.pool} not found")
        if resp.status != 200:
            raise RuntimeError(f"get inferencepool: HTTP {resp.status}: {raw[:200]!r}")
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise InvalidPool("not a JSON object")
        self.pool_reads += 1
        return pool_spec(body)

    def _adopt(self, spec: PoolSpec) -> None:
        """A new selector or port list: start over with a fresh list (the fleet stays until it is in)."""
        if spec == self.spec:
            return
        log.info("inference pool %s/%s: pods %s, ports %s", self.namespace, self.pool, spec.label_selector,
                 ",".join(map(str, spec.ports)))
        self.spec = spec
        self.pods = PodSet(spec)
        self.follower = None  # a fresh list with the new selector

    # ---- the pods ----
    async def _follow_pods(self, core: Any) -> None:
        assert self.pods is not None
        if self.follower is None:
            collection = Collection("pods", core.list_namespaced_pod_without_preload_content,
                                    core.list_namespaced_pod, self.namespace, self.pods.spec.label_selector)
            self.follower = ListWatch(collection, self.pods, self._publish, self.metrics,
                                      lambda exc, retry_s: self._failed("watch", exc, retry_s), self.timing)
        await self.follower.run()

    # ---- reporting ----
    def _publish(self) -> None:
        assert self.pods is not None
        endpoints = self.pods.endpoints()
        self.catalog.apply(endpoints)
        self.metrics.applied(SOURCE, endpoints)

    def _failed(self, what: str, exc: Exception, retry_s: float) -> None:
        self.metrics.error(SOURCE, type(exc).__name__)
        log.warning("inference pool discovery of %s/%s: %s failed (%s: %s); the last fleet stays, retrying in "
                    "%.1fs", self.namespace, self.pool, what, type(exc).__name__, exc, retry_s)
