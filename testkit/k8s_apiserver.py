"""A local stand-in for the Kubernetes API server's EndpointSlice list and watch, for tests.

It speaks the real wire format (shapes recorded in testkit/assets/k8s/): a list answers an EndpointSliceList
with metadata.resourceVersion (honouring limit/continue); `?watch=true&resourceVersion=R` streams one JSON
event per line for everything after R, then waits for changes until timeoutSeconds; a resourceVersion older
than the compaction point gets the real `ERROR` event with a 410 Expired Status. Tests change the slices,
compact history and drop open watches abruptly, and read back every request made (to see resumption).

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

ASSETS = Path(__file__).parent / "assets" / "k8s"
API_PATH = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"


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


@dataclass
class Request:
    watch: bool
    params: dict[str, str]


@dataclass
class StandInApiServer:
    namespace: str = "llm"
    host: str = "127.0.0.1"
    port: int = 0
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._slices: dict[str, dict[str, Any]] = {}
        self._history: list[tuple[int, str, dict[str, Any]]] = []  # (rv, type, object)
        self._rv = 48000
        self._compacted = 0  # watches from an older resourceVersion get 410
        self._changed = asyncio.Condition()
        self._watch_responses: dict[web.StreamResponse, web.Request] = {}
        self._runner: web.AppRunner | None = None
        self.list_failures = 0  # answer the next N lists with 500 (API server hiccup)

    # ---- lifecycle ----
    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(API_PATH, self._handle)
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
        return f"http://{self.host}:{self.port}"

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

    async def bookmark(self) -> None:
        async with self._changed:
            self._rv += 1
            self._history.append((self._rv, "BOOKMARK", {"metadata": {"resourceVersion": str(self._rv)}}))
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

    async def _record(self, kind: str, slice_: dict[str, Any]) -> None:
        async with self._changed:
            self._rv += 1
            obj = copy.deepcopy(slice_)
            obj["metadata"]["resourceVersion"] = str(self._rv)
            if kind == "DELETED":
                self._slices.pop(obj["metadata"]["name"], None)
            else:
                self._slices[obj["metadata"]["name"]] = obj
            self._history.append((self._rv, kind, obj))
            self._changed.notify_all()

    # ---- HTTP ----
    def _selected(self, selector: str) -> list[dict[str, Any]]:
        return [s for _, s in sorted(self._slices.items()) if _matches(s, selector)]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["namespace"] != self.namespace:
            return web.json_response({"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                                      "metadata": {"resourceVersion": str(self._rv)}, "items": []})
        params = dict(request.query)
        watching = params.get("watch") in ("true", "1")
        self.requests.append(Request(watching, params))
        if watching:
            return await self._watch(request, params)
        if self.list_failures > 0:
            self.list_failures -= 1
            return web.json_response(_status(500, "InternalError", "etcdserver: request timed out"), status=500)
        items = self._selected(params.get("labelSelector", ""))
        start = int(params.get("continue") or 0)
        limit = int(params.get("limit") or 0) or len(items) or 1
        page = items[start:start + limit]
        meta: dict[str, Any] = {"resourceVersion": str(self._rv)}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        body = {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1", "metadata": meta,
                "items": [{k: v for k, v in s.items() if k not in ("kind", "apiVersion")} for s in page]}
        return web.json_response(body)

    async def _watch(self, request: web.Request, params: dict[str, str]) -> web.StreamResponse:
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
                for rv, kind, obj in list(self._history):
                    if rv <= since:
                        continue
                    since = rv
                    if kind == "BOOKMARK":
                        if bookmarks:
                            await resp.write(_line({"type": "BOOKMARK", "object": {
                                "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
                                "metadata": {"resourceVersion": str(rv), "creationTimestamp": None},
                                "addressType": "", "endpoints": None, "ports": None}}))
                    elif _matches(obj, selector):
                        await resp.write(_line({"type": kind, "object": {
                            "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", **obj}}))
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
