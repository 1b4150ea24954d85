"""A local stand-in for the Kubernetes API server, for tests: EndpointSlice, Pod and InferenceObjective
(inference.networking.x-k8s.io/v1alpha2, a custom object) list and watch, and reading an InferencePool
(inference.networking.k8s.io/v1, a custom object).

It speaks the real wire format (shapes recorded in testkit/assets/k8s/): a list answers an EndpointSliceList
or PodList with metadata.resourceVersion (honouring limit/continue and labelSelector); `?watch=true&
resourceVersion=R` streams one JSON event per line for everything after R, then waits for changes until
timeoutSeconds; a resourceVersion older than the compaction point gets the real `ERROR` event with a 410
Expired Status. As the real watch cache does for a selector watch, an object modified into the selector
arrives as ADDED and one modified out of it as DELETED. A missing InferencePool is the real 404 Status, and so
is the InferenceObjective collection while its CRD is "not installed" (`objectives_served = False`).
Tests change the objects, compact history, make calls fail, drop open watches abruptly, and read back
every request made (to see resumption).

    server = StandInApiServer(); await server.start()      # in a test's event loop
    with ThreadedStandIn() as server: ...                   # for tests that drive other processes
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from loadaware.fleet.addresses import format_hostport, http_url

ASSETS = Path(__file__).parent / "assets" / "k8s"
API_PATH = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
PODS_PATH = "/api/v1/namespaces/{namespace}/pods"
POOL_PATH = "/apis/inference.networking.k8s.io/v1/namespaces/{namespace}/inferencepools/{name}"
OBJECTIVES_PATH = "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/{namespace}/inferenceobjectives"
SLICES, PODS, OBJECTIVES = "endpointslices", "pods", "inferenceobjectives"
_KINDS = {SLICES: ("EndpointSlice", "discovery.k8s.io/v1"), PODS: ("Pod", "v1"),
          OBJECTIVES: ("InferenceObjective", "inference.networking.x-k8s.io/v1alpha2")}


def recorded_list() -> dict[str, Any]:
    return json.loads((ASSETS / "endpointslice-list.json").read_text())


def recorded_events() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (ASSETS / "watch-events.jsonl").read_text().splitlines() if line]


@dataclass
class PodEndpoint:
    ip: str
    pod: str
    ready: bool = True
    terminating: bool = False
    zone: str = "zone-a"


def make_slice(name: str, service: str, namespace: str, endpoints: Sequence[PodEndpoint], port: int,
               port_name: str = "http") -> dict[str, Any]:
    """An EndpointSlice shaped like the recorded one, with these endpoints and this port."""
    slice_ = copy.deepcopy(recorded_list()["items"][0])
    meta = slice_["metadata"]
    meta.update(name=name, namespace=namespace, generateName=f"{service}-")
    meta["labels"]["kubernetes.io/service-name"] = service
    meta["labels"]["app.kubernetes.io/name"] = service
    meta["ownerReferences"][0]["name"] = service
    meta.pop("managedFields", None)
    slice_["endpoints"] = [{
        "addresses": [e.ip],
        "conditions": {"ready": e.ready and not e.terminating, "serving": e.ready, "terminating": e.terminating},
        "targetRef": {"kind": "Pod", "namespace": namespace, "name": e.pod, "uid": f"uid-{e.pod}"},
        "nodeName": "node-1", "zone": e.zone,
    } for e in endpoints]
    slice_["ports"] = [{"name": port_name, "protocol": "TCP", "port": port}]
    return slice_


def make_pod(name: str, ip: str, labels: dict[str, str], namespace: str = "llm", ready: bool = True,
             terminating: bool = False, phase: str = "Running", port: int = 8000) -> dict[str, Any]:
    """A Pod as the API server returns it (a vLLM engine), Ready or not, optionally being deleted; an empty
    `ip` is a pod not yet given one."""
    stamp = "2025-05-14T09:12:03Z"
    started = phase != "Pending"
    metadata: dict[str, Any] = {
        "name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1",
        "creationTimestamp": stamp, "labels": dict(labels),
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "vllm", "uid": "uid-vllm",
                             "controller": True, "blockOwnerDeletion": True}]}
    if terminating:
        metadata.update(deletionTimestamp="2025-05-14T09:45:00Z", deletionGracePeriodSeconds=30)
    conditions = [{"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp}]
    if started:
        flag = "True" if ready and phase == "Running" else "False"
        conditions += [{"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": stamp},
                       {"type": "ContainersReady", "status": flag, "lastProbeTime": None, "lastTransitionTime": stamp},
                       {"type": "Ready", "status": flag, "lastProbeTime": None, "lastTransitionTime": stamp}]
    status: dict[str, Any] = {"phase": phase, "conditions": conditions, "hostIP": "192.168.0.11",
                              "hostIPs": [{"ip": "192.168.0.11"}], "qosClass": "Burstable"}
    if ip:
        status.update(podIP=ip, podIPs=[{"ip": ip}], startTime=stamp)
    return {"metadata": metadata,
            "spec": {"nodeName": "gpu-node-a", "restartPolicy": "Always",
                     "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                     "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}]}]},
            "status": status}


def make_pool(name: str, match_labels: dict[str, str], ports: Sequence[int], namespace: str = "llm",
              picker: str = "loadaware-picker", picker_port: int = 9002) -> dict[str, Any]:
    """An InferencePool (inference.networking.k8s.io/v1) as the API server returns it."""
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1",
                         "generation": 1, "creationTimestamp": "2025-05-14T09:00:00Z"},
            "spec": {"selector": {"matchLabels": dict(match_labels)},
                     "targetPorts": [{"number": p} for p in ports],
                     "appProtocol": "http",
                     "endpointPickerRef": {"group": "", "kind": "Service", "name": picker,
                                           "port": {"number": picker_port}, "failureMode": "FailClose"}},
            "status": {}}


def make_objective(name: str, priority: Any, pool: str = "vllm", namespace: str = "llm",
                   pool_group: str | None = None, pool_kind: str | None = None) -> dict[str, Any]:
    """An InferenceObjective (inference.networking.x-k8s.io/v1alpha2) as the API server returns it; a priority of
    None leaves spec.priority unset (any other value is set as given, an integer or not), a pool group or kind of
    None leaves the poolRef's default to the server."""
    ref: dict[str, Any] = {"name": pool}
    if pool_group is not None:
        ref["group"] = pool_group
    if pool_kind is not None:
        ref["kind"] = pool_kind
    spec: dict[str, Any] = {"poolRef": ref}
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1",
                         "generation": 1, "creationTimestamp": "2025-05-14T09:00:00Z"},
            "spec": spec,
            "status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "Pending",
                                       "message": "Waiting for controller",
                                       "lastTransitionTime": "1970-01-01T00:00:00Z"}]}}


@dataclass
class Request:
    watch: bool
    params: dict[str, str]
    resource: str = SLICES  # endpointslices, pods, inferencepools or inferenceobjectives


@dataclass
class StandInApiServer:
    namespace: str = "llm"
    host: str = "127.0.0.1"
    port: int = 0
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._objects: dict[str, dict[str, dict[str, Any]]] = {SLICES: {}, PODS: {}, OBJECTIVES: {}}
        self._slices = self._objects[SLICES]
        self._pools: dict[str, dict[str, Any]] = {}
        # (rv, type, object, resource, the object before the change); a BOOKMARK has no resource
        self._history: list[tuple[int, str, dict[str, Any], str, dict[str, Any] | None]] = []
        self._rv = 48000
        self._compacted = 0  # watches from an older resourceVersion get 410
        self._changed = asyncio.Condition()
        self._watch_responses: dict[web.StreamResponse, web.Request] = {}
        self._runner: web.AppRunner | None = None
        self.list_failures = 0  # answer the next N EndpointSlice lists with 500 (API server hiccup)
        self.pod_list_failures = 0  # answer the next N pod lists with 500
        self.pool_failures = 0  # answer the next N InferencePool reads with 500
        self.objective_list_failures = 0  # answer the next N InferenceObjective lists with 500
        self.objectives_served = True  # False: the CRD is not installed, its collection is a 404

    # ---- lifecycle ----
    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(API_PATH, self._handle)
        app.router.add_get(PODS_PATH, self._handle_pods)
        app.router.add_get(POOL_PATH, self._handle_pool)
        app.router.add_get(OBJECTIVES_PATH, self._handle_objectives)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        await self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return http_url(format_hostport(self.host, self.port))

    def kubeconfig(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Config", "current-context": "standin",
                "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
                "users": [{"name": "standin", "user": {"token": "standin-token"}}],
                "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin",
                                                               "namespace": self.namespace}}]}

    # ---- changes (what the endpointslice controller would do) ----
    async def upsert(self, slice_: dict[str, Any]) -> None:
        name = slice_["metadata"]["name"]
        kind = "MODIFIED" if name in self._slices else "ADDED"
        await self._record(kind, slice_)

    async def delete(self, name: str) -> None:
        if name in self._slices:
            await self._record("DELETED", self._slices[name])

    # ---- pods (what the kubelet and the scheduler would do) and InferencePools (what an operator would) ----
    async def upsert_pod(self, pod: dict[str, Any]) -> None:
        kind = "MODIFIED" if pod["metadata"]["name"] in self._objects[PODS] else "ADDED"
        await self._record(kind, pod, PODS)

    async def delete_pod(self, name: str) -> None:
        if name in self._objects[PODS]:
            await self._record("DELETED", self._objects[PODS][name], PODS)

    def set_pool(self, pool: dict[str, Any]) -> None:
        self._rv += 1
        obj = copy.deepcopy(pool)
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._pools[obj["metadata"]["name"]] = obj

    def delete_pool(self, name: str) -> None:
        self._pools.pop(name, None)

    async def upsert_objective(self, objective: dict[str, Any]) -> None:
        kind = "MODIFIED" if objective["metadata"]["name"] in self._objects[OBJECTIVES] else "ADDED"
        await self._record(kind, objective, OBJECTIVES)

    async def delete_objective(self, name: str) -> None:
        if name in self._objects[OBJECTIVES]:
            await self._record("DELETED", self._objects[OBJECTIVES][name], OBJECTIVES)

    async def bookmark(self) -> None:
        async with self._changed:
            self._rv += 1
            self._history.append((self._rv, "BOOKMARK", {"metadata": {"resourceVersion": str(self._rv)}}, "", None))
            self._changed.notify_all()

    def compact(self) -> None:
        """Forget history up to now: a watch from an older resourceVersion gets 410 Expired."""
        self._compacted = self._rv
        self._history.clear()

    async def drop_watches(self) -> None:
        """Cut every open watch connection without a clean end (a load balancer or API server restart)."""
        for request in list(self._watch_responses.values()):
            if request.transport is not None:
                request.transport.abort()
        self._watch_responses.clear()
        async with self._changed:
            self._changed.notify_all()

    async def _record(self, kind: str, obj_: dict[str, Any], resource: str = SLICES) -> None:
        async with self._changed:
            self._rv += 1
            obj = copy.deepcopy(obj_)
            obj["metadata"]["resourceVersion"] = str(self._rv)
            store = self._objects[resource]
            name = obj["metadata"]["name"]
            before = copy.deepcopy(store.get(name))
            if before is not None:  # a DELETED made of it (moved out of a selection) carries the event's version
                before["metadata"]["resourceVersion"] = str(self._rv)
            if kind == "DELETED":
                store.pop(name, None)
            else:
                store[name] = obj
            self._history.append((self._rv, kind, obj, resource, before))
            self._changed.notify_all()

    # ---- HTTP ----
    def _selected(self, selector: str, resource: str = SLICES) -> list[dict[str, Any]]:
        return [s for _, s in sorted(self._objects[resource].items()) if _matches(s, selector)]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        return await self._handle_collection(request, SLICES)

    async def _handle_pods(self, request: web.Request) -> web.StreamResponse:
        return await self._handle_collection(request, PODS)

    async def _handle_objectives(self, request: web.Request) -> web.StreamResponse:
        if not self.objectives_served:  # what the API server answers for a resource no CRD defines
            self.requests.append(Request(request.query.get("watch") in ("true", "1"), dict(request.query), OBJECTIVES))
            return web.json_response(_status(404, "NotFound", "the server could not find the requested resource"),
                                     status=404)
        return await self._handle_collection(request, OBJECTIVES)

    async def _handle_collection(self, request: web.Request, resource: str) -> web.StreamResponse:
        kind, api_version = _KINDS[resource]
        if request.match_info["namespace"] != self.namespace:
            return web.json_response({"kind": f"{kind}List", "apiVersion": api_version,
                                      "metadata": {"resourceVersion": str(self._rv)}, "items": []})
        params = dict(request.query)
        watching = params.get("watch") in ("true", "1")
        self.requests.append(Request(watching, params, resource))
        if watching:
            return await self._watch(request, params, resource)
        if self._take_failure(resource):
            return web.json_response(_status(500, "InternalError", "etcdserver: request timed out"), status=500)
        items = self._selected(params.get("labelSelector", ""), resource)
        start = int(params.get("continue") or 0)
        limit = int(params.get("limit") or 0) or len(items) or 1
        page = items[start:start + limit]
        meta: dict[str, Any] = {"resourceVersion": str(self._rv)}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        body = {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta,
                "items": [{k: v for k, v in s.items() if k not in ("kind", "apiVersion")} for s in page]}
        return web.json_response(body)

    def _take_failure(self, resource: str) -> bool:
        if resource == SLICES and self.list_failures > 0:
            self.list_failures -= 1
            return True
        if resource == PODS and self.pod_list_failures > 0:
            self.pod_list_failures -= 1
            return True
        if resource == OBJECTIVES and self.objective_list_failures > 0:
            self.objective_list_failures -= 1
            return True
        return False

    async def _handle_pool(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.requests.append(Request(False, {"name": name}, "inferencepools"))
        if self.pool_failures > 0:
            self.pool_failures -= 1
            return web.json_response(_status(500, "InternalError", "etcdserver: request timed out"), status=500)
        pool = self._pools.get(name) if request.match_info["namespace"] == self.namespace else None
        if pool is None:
            return web.json_response(_status(404, "NotFound", f'inferencepools.inference.networking.k8s.io '
                                                              f'"{name}" not found'), status=404)
        return web.json_response(pool)

    async def _watch(self, request: web.Request, params: dict[str, str],
                     resource: str = SLICES) -> web.StreamResponse:
        kind_name, api_version = _KINDS[resource]
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        since = int(params.get("resourceVersion") or self._rv)
        selector = params.get("labelSelector", "")
        timeout = float(params.get("timeoutSeconds") or 1800)
        bookmarks = params.get("allowWatchBookmarks") == "true"
        if since < self._compacted:
            await resp.write(_line({"type": "ERROR", "object": _status(
                410, "Expired", f"too old resource version: {since} ({self._compacted})")}))
            return resp
        self._watch_responses[resp] = request
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while resp in self._watch_responses:
                for rv, kind, obj, of, before in list(self._history):
                    if rv <= since:
                        continue
                    since = rv
                    if kind == "BOOKMARK":
                        if bookmarks:
                            await resp.write(_line({"type": "BOOKMARK", "object": _bookmark(resource, rv)}))
                    elif of == resource:
                        seen = _selector_event(kind, obj, before, selector)
                        if seen is not None:
                            await resp.write(_line({"type": seen[0], "object": {
                                "kind": kind_name, "apiVersion": api_version, **seen[1]}}))
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                async with self._changed:
                    try:
                        await asyncio.wait_for(self._changed.wait(), remaining)
                    except TimeoutError:
                        pass
            else:
                return resp  # dropped: the transport is already gone
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass
        finally:
            self._watch_responses.pop(resp, None)
        return resp



def _selector_event(kind: str, obj: dict[str, Any], before: dict[str, Any] | None,
                    selector: str) -> tuple[str, dict[str, Any]] | None:
    """The event a watch with this label selector sees, as the watch cache makes it: a change into the
    selection is ADDED, out of it DELETED (carrying the object as it was, when it still matched), a change
    on neither side is nothing."""
    now = _matches(obj, selector)
    if kind != "MODIFIED":
        return (kind, obj) if now else None
    if before is not None and _matches(before, selector):
        return ("MODIFIED", obj) if now else ("DELETED", before)
    return ("ADDED", obj) if now else None


def _bookmark(resource: str, rv: int) -> dict[str, Any]:
    kind, api_version = _KINDS[resource]
    meta = {"resourceVersion": str(rv), "creationTimestamp": None}
    if resource == SLICES:
        return {"kind": kind, "apiVersion": api_version, "metadata": meta, "addressType": "", "endpoints": None,
                "ports": None}
    if resource == OBJECTIVES:
        return {"kind": kind, "apiVersion": api_version, "metadata": meta}
    return {"kind": kind, "apiVersion": api_version, "metadata": meta, "spec": {"containers": None}, "status": {}}


def _matches(obj: dict[str, Any], selector: str) -> bool:
    wanted = dict(part.split("=", 1) for part in selector.split(",") if "=" in part)
    labels = obj["metadata"].get("labels", {})
    return all(labels.get(k) == v for k, v in wanted.items())


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class ThreadedStandIn:
    """The stand-in on its own event loop thread, driven from synchronous tests."""

    def __init__(self, namespace: str = "llm") -> None:
        self.server = StandInApiServer(namespace=namespace)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="k8s-standin", daemon=True)

    def call(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def __enter__(self) -> StandInApiServer:
        self._thread.start()
        self.call(self.server.start())
        return self.server

    def __exit__(self, *exc: object) -> None:
        try:
            self.call(self.server.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()

    def requests(self) -> Iterator[Request]:
        return iter(list(self.server.requests))
