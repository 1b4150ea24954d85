"""InferenceObjective discovery: on Kubernetes, objectives' priorities come from the Gateway API Inference
Extension's InferenceObjective resources (inference.networking.x-k8s.io/v1alpha2) of the pool's namespace.

An InferenceObjective names an objective (its metadata.name, what a request sends in
x-gateway-inference-objective), the pool it applies to (spec.poolRef: group inference.networking.k8s.io and
kind InferencePool by default) and its priority (spec.priority, an integer; absent means 0, below 0 is
sheddable). The sidecar serving the InferencePool --inference-pool takes the objectives that reference it;
a sidecar with no pool name (EndpointSlice discovery) takes every objective of its namespace.

Pure part: objective_priority() and ObjectiveSet, the collection folded into {objective: priority}, bounded as an
objectives file is (at most MAX_OBJECTIVES, priorities integers within PRIORITY_RANGE, names of at most
MAX_NAME_CHARS; the bounds live here, and loadaware/admission/objectives.py checks a file with them): an objective
outside them is skipped, logged and counted, never fatal. I/O part: InferenceObjectivesWatch follows the collection
with ListWatch and hands the whole map to `on_change` (Objectives.set_cluster) after each list and each event that
changes it. Fail open: while the API server fails, the last priorities stay; each failure is counted in
loadaware_discovery_errors_total{source="inference-objectives"}. No InferenceObjective CRD (404) or no permission to
read it (403) is a setup, not a failure: logged once, not counted, retried every `unavailable_retry_s`; the
objectives file's priorities alone apply meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from loadaware.fleet.discovery.kubernetes import ApiClientFactory
from loadaware.fleet.discovery.listwatch import Collection, ListWatch, WatchTiming
from loadaware.fleet.discovery.metrics import DiscoveryMetrics

log = logging.getLogger(__name__)

SOURCE = "inference-objectives"
GROUP = "inference.networking.x-k8s.io"
VERSION = "v1alpha2"
PLURAL = "inferenceobjectives"
POOL_GROUP = "inference.networking.k8s.io"  # spec.poolRef's defaults: the InferencePool of the v1 API
POOL_KIND = "InferencePool"
# What this source asks of the API server, in its own namespace: (API group, resource, verbs). The picker's
# Role must grant at least this (k8s/inference-pool/pool/picker-rbac.yaml; tests/k8s checks it).
API_CALLS = ((GROUP, PLURAL, ("list", "watch")),)

# The bounds of an objective, from the cluster or an objectives file (loadaware/admission/objectives.py).
DEFAULT_PRIORITY = 0
MAX_OBJECTIVES = 10_000
PRIORITY_RANGE = (-1_000_000, 1_000_000)
MAX_NAME_CHARS = 128  # a request's objective header is cut there (extproc/metadata.py): a longer name never matches
UNAVAILABLE = (403, 404)  # no such resource (the CRD is not installed), or no permission to read it


# ---- pure mapping --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Skipped:
    """An objective of this pool that gives no priority: its name and why."""

    name: str
    reason: str


def references(obj: Mapping[str, Any], pool: str) -> bool:
    """Does the objective apply to the InferencePool `pool` (any pool when `pool` is empty)?"""
    if not pool:
        return True
    spec = obj.get("spec")
    ref = spec.get("poolRef") if isinstance(spec, Mapping) else None
    if not isinstance(ref, Mapping):
        return False
    return (ref.get("name") == pool and (ref.get("group") or POOL_GROUP) == POOL_GROUP
            and (ref.get("kind") or POOL_KIND) == POOL_KIND)


def objective_priority(obj: Mapping[str, Any], pool: str) -> tuple[str, int] | Skipped | None:
    """(name, priority) of an InferenceObjective that applies to `pool`; None when it applies to another pool;
    Skipped when it applies here but its name or priority is outside the bounds."""
    if not references(obj, pool):
        return None
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        return Skipped("", "no metadata.name")
    if len(name) > MAX_NAME_CHARS:
        return Skipped(name[:MAX_NAME_CHARS], f"a name longer than {MAX_NAME_CHARS} characters (a request's "
                                              f"objective header is cut there)")
    spec = obj.get("spec")
    priority = spec.get("priority") if isinstance(spec, Mapping) else None
    if priority is None:
        return name, DEFAULT_PRIORITY  # unset: the Inference Extension's default
    if not valid_priority(priority):
        return Skipped(name, f"priority {str(priority)[:40]!r} is not an integer in "
                             f"{PRIORITY_RANGE[0]}..{PRIORITY_RANGE[1]}")
    return name, priority


def valid_priority(value: Any) -> TypeGuard[int]:
    """An integer (not a bool) within PRIORITY_RANGE."""
    return (not isinstance(value, bool) and isinstance(value, int)
            and PRIORITY_RANGE[0] <= value <= PRIORITY_RANGE[1])


class ObjectiveSet:
    """The priorities of the pool's objectives, by name, folded from a list and watch events. `skipped` holds
    what the last replace() or apply() refused (for the caller to log and count)."""

    def __init__(self, pool: str, limit: int = MAX_OBJECTIVES) -> None:
        self.pool = pool
        self.limit = limit
        self._priorities: dict[str, int] = {}
        self.skipped: list[Skipped] = []

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.skipped = []
        priorities: dict[str, int] = {}
        for obj in items:
            found = objective_priority(obj, self.pool)
            if isinstance(found, Skipped):
                self.skipped.append(found)
            elif found is not None:
                priorities[found[0]] = found[1]
        if len(priorities) > self.limit:  # by name, so the same objectives are kept whatever order the list had
            names = sorted(priorities)
            self.skipped += [Skipped(n, f"over the limit of {self.limit} objectives") for n in names[self.limit:]]
            priorities = {n: priorities[n] for n in names[:self.limit]}
        self._priorities = priorities

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Fold one watch event in; True when a priority changed (a status update changes none) or the
        objective was skipped (for the caller to report)."""
        self.skipped = []
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return False  # BOOKMARK: only the resourceVersion moves
        metadata = obj.get("metadata")
        name = str(metadata.get("name") or "") if isinstance(metadata, Mapping) else ""
        found = objective_priority(obj, self.pool) if event_type != "DELETED" else None
        if isinstance(found, Skipped):
            self.skipped.append(found)
            found = None
        if found is None:  # deleted, moved to another pool, or no longer valid: its priority goes
            return self._priorities.pop(name, None) is not None or bool(self.skipped)
        if found[0] not in self._priorities and len(self._priorities) >= self.limit:
            self.skipped.append(Skipped(found[0], f"over the limit of {self.limit} objectives"))
            return True
        changed = self._priorities.get(found[0]) != found[1]
        self._priorities[found[0]] = found[1]
        return changed or bool(self.skipped)

    def priorities(self) -> dict[str, int]:
        return dict(self._priorities)

    def __len__(self) -> int:
        return len(self._priorities)


# ---- I/O -----------------------------------------------------------------------------------------------

class Unavailable(Exception):
    """The API server has no InferenceObjectives for us: the CRD is not installed (404) or reading it is not
    permitted (403)."""

    def __init__(self, status: int, detail: str = "") -> None:
        super().__init__(f"HTTP {status}{': ' + detail if detail else ''}")
        self.status = status


def objectives_collection(custom: Any, namespace: str) -> Collection:
    """The namespace's InferenceObjectives as a ListWatch collection, on the client's CustomObjectsApi: its
    generic calls take the group, version and plural first, which ListWatch's calls (namespace first) do not
    pass, so both are wrapped. A 403 or 404 answer raises Unavailable."""

    async def list_page(namespace: str, *, label_selector: str = "", limit: int | None = None,
                        _continue: str | None = None, _request_timeout: float | None = None) -> Any:
        return await _checked(custom.list_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, namespace, PLURAL, label_selector=label_selector or None, limit=limit,
            _continue=_continue, _request_timeout=_request_timeout))

    # Watch.stream(func, namespace, label_selector=..., resource_version=..., watch=True, ...) calls func with
    # _preload_content=False when func is not a client method; the raw call already returns the unread response.
    async def watch_call(namespace: str, *, label_selector: str = "", _preload_content: bool = False,
                         **kwargs: Any) -> Any:
        return await _checked(custom.list_namespaced_custom_object_without_preload_content(
            GROUP, VERSION, namespace, PLURAL, label_selector=label_selector or None, **kwargs))

    return Collection(PLURAL, list_page, watch_call, namespace, "")


async def _checked(call: Any) -> Any:
    resp = await call
    if resp.status in UNAVAILABLE:
        try:
            raw = await resp.read()
        finally:
            resp.release()
        raise Unavailable(resp.status, raw[:200].decode("utf-8", "replace"))
    return resp


# One list page within 10 s; a missing CRD (or Role) asked about again every minute.
OBJECTIVES_TIMING = WatchTiming(request_timeout_s=10.0, recheck_s=60.0)


class InferenceObjectivesWatch:
    name = SOURCE

    def __init__(self, namespace: str, pool: str, on_change: Callable[[dict[str, int]], None],
                 metrics: DiscoveryMetrics, client_factory: ApiClientFactory,
                 timing: WatchTiming = OBJECTIVES_TIMING) -> None:
        self.namespace = namespace
        self.pool = pool  # "" takes every objective of the namespace
        self.objectives = ObjectiveSet(pool)
        self.on_change = on_change
        self.metrics = metrics
        self.client_factory = client_factory
        self.timing = timing
        self.unavailable_retry_s = timing.recheck_s  # how soon a CRD installed (or a Role granted) later is seen
        self.follower: ListWatch | None = None
        self.unavailable: int | None = None  # the 403 / 404 last answered, until a list succeeds

    async def run(self) -> None:
        from kubernetes.aio import client

        api_client = await self.client_factory()
        try:
            custom = client.CustomObjectsApi(api_client)
            self.follower = ListWatch(objectives_collection(custom, self.namespace), self.objectives, self._publish,
                                      self.metrics, self._failed, self.timing)
            while True:
                try:
                    await self.follower.run()
                except Unavailable as exc:
                    self._unavailable(exc)
                    self.follower.resource_version = None  # a fresh list once it is there
                    await asyncio.sleep(self.unavailable_retry_s)
        finally:
            await api_client.close()

    def _publish(self) -> None:
        for skipped in self.objectives.skipped[:5]:
            log.warning("InferenceObjective %s/%s skipped: %s", self.namespace, skipped.name or "?", skipped.reason)
        if len(self.objectives.skipped) > 5:
            log.warning("... and %d more InferenceObjectives skipped", len(self.objectives.skipped) - 5)
        if self.objectives.skipped:
            self.metrics.errors.labels(SOURCE, "invalid_objective").inc(len(self.objectives.skipped))
        if self.unavailable is not None:
            log.info("InferenceObjectives in %s are readable now", self.namespace)
            self.unavailable = None
        priorities = self.objectives.priorities()
        log.debug("InferenceObjectives in %s for pool %s: %d objectives", self.namespace, self.pool or "(any)",
                  len(priorities))
        self.on_change(priorities)

    def _failed(self, exc: Exception, retry_s: float) -> None:
        # ListWatch reports every failure here and retries it; a missing CRD or a missing grant is no failure
        # to retry quickly: raised out of ListWatch.run, run() waits unavailable_retry_s instead.
        if isinstance(exc, Unavailable):
            raise exc
        status = getattr(exc, "status", None)  # the watch's own ApiException (a Status line)
        if status in UNAVAILABLE:
            raise Unavailable(status, str(exc)[:200]) from exc
        self.metrics.error(SOURCE, type(exc).__name__)
        log.warning("InferenceObjectives of %s: watch failed (%s: %s); the last priorities stay, retrying in %.1fs",
                    self.namespace, type(exc).__name__, exc, retry_s)

    def _unavailable(self, exc: Unavailable) -> None:
        if exc.status == self.unavailable:
            return  # logged once
        self.unavailable = exc.status
        why = ("no InferenceObjective resource is served (its CRD is not installed)" if exc.status == 404 else
               f"reading {PLURAL}.{GROUP} is not permitted: grant list and watch on it")
        log.warning("InferenceObjectives of %s: %s (%s); the --objectives file's priorities (and any the cluster "
                    "gave before) apply; retrying every %gs (--watch-objectives off stops this)", self.namespace,
                    why, exc, self.unavailable_retry_s)
