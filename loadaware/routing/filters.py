"""Stage 1, the filter: the endpoints a decision may choose among.

    pool = the fleet, or the part of it in the proxy's subset hint
           then only the engines serving the request's model, when their models are known
           less the engines failing their requests (fleet/health.py); all of them when that leaves nobody

A model's engines are its own fleet: the policy compares loads (and takes the mean) over what this returns
(docs/architecture.md, "Model pools"). A failing model map or health tracker filters nothing (fail open).
"""

from __future__ import annotations

from typing import Protocol

from loadaware.fleet.members import member_set
from loadaware.fleet.registry import EndpointRegistry
from loadaware.routing.context import ALL_FAILING, DecisionContext, degraded
from loadaware.routing.pruning import MIN_POOL


class Eligibility(Protocol):
    def eligible(self, endpoints: tuple[str, ...]) -> tuple[str, ...]: ...

    def not_admitted(self) -> set[str]: ...

    def capped(self, out: frozenset[str], candidates: int) -> frozenset[str]: ...


class ModelPools(Protocol):
    def pool(self, model: str, endpoints: tuple[str, ...]) -> tuple[str, ...] | None: ...


class PoolFilter:
    def __init__(self, registry: EndpointRegistry, health: Eligibility | None = None,
                 models: ModelPools | None = None) -> None:
        self.registry = registry
        self.health = health  # engines failing their requests are left out (fleet/health.py)
        self.models = models  # which engines serve which model (None: model awareness off)

    def endpoints(self, subset: frozenset[str] | None, model: str | None = None,
                  reasons: list[str] | None = None) -> tuple[str, ...]:
        """The fleet, or the part of it in the subset; then only the engines serving `model`."""
        fleet = self.registry.snapshot()
        eligible = fleet if subset is None else tuple(ep for ep in fleet if ep in subset)
        if model is None or self.models is None:
            return eligible
        try:
            pool = self.models.pool(model, eligible)
        except Exception as exc:  # noqa: BLE001 - a failing model map filters nothing (fail open)
            degraded(reasons, "models_error", exc)
            return eligible
        return eligible if pool is None else pool

    def candidates(self, subset: frozenset[str] | None, model: str | None, reasons: list[str]) -> tuple[str, ...]:
        """The pool, failing engines left out (all of them when that leaves nobody, and the decision says so)."""
        return self.eligible(self.endpoints(subset, model, reasons), reasons)

    def eligible(self, endpoints: tuple[str, ...], reasons: list[str]) -> tuple[str, ...]:
        """`endpoints` less the engines failing their requests (all of them when that leaves nobody)."""
        if self.health is None or not endpoints:
            return endpoints
        try:
            eligible = self.health.eligible(endpoints)
        except Exception as exc:  # noqa: BLE001 - a failing health tracker leaves nobody out (fail open)
            degraded(reasons, "health_error", exc)
            return endpoints
        if eligible:
            return eligible
        if ALL_FAILING not in reasons:
            reasons.append(ALL_FAILING)
        return endpoints

    def narrow(self, ctx: DecisionContext) -> None:
        """The pool as (ctx.endpoints, ctx.excluded): a large pool is not filtered one endpoint at a time; the few
        engines failing their requests come back as a set to leave out (empty for a small pool, which is
        filtered, and when failing open)."""
        ctx.endpoints, ctx.excluded = self._pool(ctx.subset, ctx.model, ctx.reasons)

    def _pool(self, subset: frozenset[str] | None, model: str | None, reasons: list[str]
              ) -> tuple[tuple[str, ...], frozenset[str]]:
        endpoints = self.endpoints(subset, model, reasons)
        if self.health is None or len(endpoints) < MIN_POOL:
            return self.eligible(endpoints, reasons), frozenset()
        try:
            out = self.health.not_admitted()
            if not out:
                return endpoints, frozenset()
            members = member_set(endpoints)
            excluded = self.health.capped(frozenset(ep for ep in out if ep in members), len(endpoints))
        except Exception as exc:  # noqa: BLE001 - a failing health tracker leaves nobody out (fail open)
            degraded(reasons, "health_error", exc)
            return endpoints, frozenset()
        if len(excluded) < len(endpoints):
            return endpoints, excluded
        if ALL_FAILING not in reasons:
            reasons.append(ALL_FAILING)
        return endpoints, frozenset()

    def model_unserved(self, model: str | None) -> bool:
        """No engine of the whole fleet serves `model` (the gateway answers 404 itself)."""
        return model is not None and self.models is not None and self.models.pool(model, self.registry.snapshot()) == ()
