"""One Kubernetes collection followed the way the API server means it to be: list, then watch, resumed.

Watch protocol (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes):
list -> resourceVersion R; watch from R; every event (and BOOKMARK) advances R. A dropped connection
resumes the watch from the last R, so nothing is missed and nothing is re-listed; 410 Gone (R compacted
away) means re-list. The last good set stays while the API server is unreachable.

Both Kubernetes discoveries (EndpointSlices of a Service, the pods of an InferencePool) follow their
collection with one `ListWatch`; what differs is the collection's calls and how its objects fold into
endpoints (a `Fold`). Every list page has a time box; the watch is bounded by its server-side timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from loadaware.fleet.discovery.metrics import DiscoveryMetrics

log = logging.getLogger(__name__)

LIST_PAGE = 500


class Gone(Exception):
    """410: the resourceVersion we hold was compacted away; only a fresh list helps."""


class Fold(Protocol):
    """A collection's objects folded into what discovery reports."""

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None: ...

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Fold one watch event in; True when the endpoint set may have changed."""
        ...


@dataclass(frozen=True)
class Collection:
    """What to follow: `list_page(namespace, label_selector=, limit=, _continue=, _request_timeout=)` (the
    client's `*_without_preload_content` list) and `watch_call` (the same list, for `Watch.stream`)."""
    what: str  # for errors: "endpointslices", "pods"
    list_page: Callable[..., Awaitable[Any]]
    watch_call: Any
    namespace: str
    label_selector: str


@dataclass(frozen=True)
class WatchTiming:
    """How a follower of the API server paces itself."""

    # Server-side watch timeout: the API server ends the watch cleanly and we resume; it also bounds how long a
    # silently dead connection can go unnoticed.
    watch_timeout_s: int = 290
    request_timeout_s: float = 30.0  # time box of one list page (or one read)
    backoff_s: tuple[float, float] = (0.5, 15.0)  # first and longest wait after a failure (doubling between)
    # How soon a change the watch cannot show is seen: the InferencePool's own spec, a CRD installed later.
    recheck_s: float = 5.0


LIST_WATCH_TIMING = WatchTiming()


class ListWatch:
    def __init__(self, collection: Collection, fold: Fold, on_change: Callable[[], None], metrics: DiscoveryMetrics,
                 failed: Callable[[Exception, float], None], timing: WatchTiming = LIST_WATCH_TIMING) -> None:
        self.collection = collection
        self.fold = fold
        self.on_change = on_change
        self.metrics = metrics
        self.failed = failed
        self.watch_timeout_s = timing.watch_timeout_s
        self.request_timeout_s = timing.request_timeout_s
        self.backoff_s = timing.backoff_s
        self.resource_version: str | None = None
        self.lists = 0
        self.watches = 0
        self._progress = False  # the current watch delivered something: its failure is not a pattern
        self._listed = False  # the next watch starts from a fresh list (else it resumes a dropped one)

    async def run(self) -> None:
        """List (when there is no resourceVersion to resume from), then watch, forever. A watch the server ends
        (its timeout) resumes at once; 410 Gone re-lists; any other failure keeps the last fleet, is reported to
        `failed` and retried with exponential backoff (from the start again after a watch that worked)."""
        delay = self.backoff_s[0]
        while True:
            try:
                if self.resource_version is None:
                    await self._list()
                await self._watch()
                delay = self.backoff_s[0]
            except Gone:
                log.info("discovery: resourceVersion %s expired; re-listing", self.resource_version)
                self.resource_version = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the API server being away keeps the last fleet
                if self._progress:
                    delay = self.backoff_s[0]
                self.failed(exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_s[1])

    async def _list(self) -> None:
        c = self.collection
        items: list[Mapping[str, Any]] = []
        token: str | None = None
        metadata: Mapping[str, Any] = {}
        while True:
            async with asyncio.timeout(self.request_timeout_s):
                resp = await c.list_page(c.namespace, label_selector=c.label_selector, limit=LIST_PAGE,
                                         _continue=token, _request_timeout=self.request_timeout_s)
                try:
                    raw = await resp.read()
                finally:
                    resp.release()
            body = list_body(c.what, resp.status, raw)
            items.extend(body.get("items") or [])
            metadata = body.get("metadata") or {}
            token = metadata.get("continue") or None
            if token is None:
                break
        self.fold.replace(items)
        self._progress = True
        self.resource_version = str(metadata.get("resourceVersion") or "") or None
        self.lists += 1
        self._listed = True
        self.metrics.watch_restart("relist")
        self.on_change()

    async def _watch(self) -> None:
        from kubernetes.aio.watch import Watch

        c = self.collection
        self.watches += 1
        self._progress = False
        if not self._listed:
            self.metrics.watch_restart("resume")
        self._listed = False
        watch = Watch(return_type="object")  # plain dicts: no client models built per event
        async for event in watch_events(watch, c.watch_call, c.namespace, c.label_selector, self.resource_version,
                                        self.watch_timeout_s):
            self._progress = True
            if watch.resource_version:
                self.resource_version = str(watch.resource_version)
            if self.fold.apply(event["type"], event["raw_object"]):
                self.on_change()


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


def list_body(what: str, status: int, raw: bytes) -> dict[str, Any]:
    if status == 410:
        raise Gone()
    if status != 200:
        raise RuntimeError(f"list {what}: HTTP {status}: {raw[:200]!r}")
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise RuntimeError(f"list {what}: not a JSON object")
    return body
