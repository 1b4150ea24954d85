"""Which models each engine serves: vLLM's `GET /v1/models`, parsed, and the pools a request's model selects.

Every id listed is servable: each `--served-model-name` is its own entry and each loaded LoRA adapter is an
entry whose `parent` is the base model's served name. Pure apart from the clock used for staleness.

Fail open (docs/architecture.md, "Model pools"): an endpoint whose list was never fetched, or whose last
good list is older than the staleness bound, counts as serving any model; with no endpoint's list known
there is nothing to filter on at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ServedModels:
    ids: frozenset[str]  # every name a request's `model` may use on this engine
    parents: Mapping[str, str] = field(default_factory=dict)  # adapter id -> the base model it runs on

    def names(self) -> list[str]:
        return sorted(self.ids)


def parse_models(body: Any) -> ServedModels:
    """The models of one `/v1/models` answer (already JSON-decoded). Raises ValueError for a body that is not
    an OpenAI model list; entries without a string id are skipped (nothing could request them)."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise ValueError("not an OpenAI model list (no 'data' array)")
    ids: set[str] = set()
    parents: dict[str, str] = {}
    for item in body["data"]:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            continue
        ids.add(item["id"])
        parent = item.get("parent")
        if isinstance(parent, str) and parent and parent != item["id"]:
            parents[item["id"]] = parent
    return ServedModels(frozenset(ids), parents)


class EndpointModels:
    """endpoint -> its models, as last fetched. Written by the poller, read on every decision."""

    def __init__(self, stale_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_s = stale_s  # a failing endpoint keeps its last good list this long, then counts as unknown
        self.clock = clock
        self._known: dict[str, tuple[ServedModels, float]] = {}
        # model id -> the known endpoints listing it, so a pool every known engine serves is found without
        # visiting the fleet (docs/architecture.md, "Fleet size")
        self._serving: dict[str, set[str]] = {}

    def record(self, endpoint: str, models: ServedModels) -> None:
        self._unindex(endpoint)
        now = self.clock()
        self._known[endpoint] = (models, now)
        for model in models.ids:
            self._serving.setdefault(model, set()).add(endpoint)

    def forget(self, endpoint: str) -> None:
        """The endpoint left the fleet (EndpointRegistry.on_removed): a returning one is fetched afresh."""
        self._unindex(endpoint)
        self._known.pop(endpoint, None)

    def _unindex(self, endpoint: str) -> None:
        entry = self._known.get(endpoint)
        if entry is None:
            return
        for model in entry[0].ids:
            serving = self._serving.get(model)
            if serving is not None:
                serving.discard(endpoint)
                if not serving:
                    del self._serving[model]

    def models_of(self, endpoint: str, now: float | None = None) -> ServedModels | None:
        """None: unknown (never fetched, or the last good list is stale)."""
        entry = self._known.get(endpoint)
        if entry is None:
            return None
        now = self.clock() if now is None else now
        return entry[0] if now - entry[1] <= self.stale_s else None

    def pool(self, model: str, endpoints: Iterable[str]) -> tuple[str, ...] | None:
        """The endpoints that may serve `model`, in the given order: those listing it, and those whose list is
        unknown (fail open). None when no endpoint's list is known: no filtering is possible. When every known
        list names `model` (fresh or stale: a stale one counts as unknown, which serves anything too), that is
        all of `endpoints`, found without visiting them."""
        if not self._known:
            return None
        if len(self._serving.get(model, ())) == len(self._known):
            return endpoints if isinstance(endpoints, tuple) else tuple(endpoints)
        now = self.clock()
        out: list[str] = []
        any_known = False
        for ep in endpoints:
            models = self.models_of(ep, now)
            if models is None:
                out.append(ep)
            else:
                any_known = True
                if model in models.ids:
                    out.append(ep)
        return tuple(out) if any_known else None

    def served_anywhere(self, model: str) -> bool:
        """Some endpoint with a known list serves `model`."""
        now = self.clock()
        return any(model in m.ids for ep in self._known if (m := self.models_of(ep, now)) is not None)

    def state(self, endpoints: Iterable[str]) -> dict[str, dict[str, Any] | None]:
        """Per endpoint what /debug/state shows: its models and adapters (None: unknown, serves anything)."""
        now = self.clock()
        out: dict[str, dict[str, Any] | None] = {}
        for ep in endpoints:
            models = self.models_of(ep, now)
            out[ep] = None if models is None else {"models": models.names(), "adapters": dict(models.parents)}
        return out
