"""The decision core's shape: a policy's optional capabilities are checked when it is made, never mid-decision;
the builder's defaults are the settings table's; the simulator's core is built as the sidecar's is."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import pytest

from experiment.product_router import ProductRouter
from loadaware.config import Settings, core_options, from_args
from loadaware.policies import Candidate, Choice, Needs, check_capabilities, make_policy
from loadaware.policies.large_pool import LargePool, Selected
from loadaware.policies.loadaware import LoadAware
from loadaware.routing.builder import CoreOptions


@dataclass
class DeclaresFlooredOnly(LoadAware):
    name: str = "declares-floored"
    needs: ClassVar[Needs] = Needs(floored=True)


@dataclass
class SelectsUndeclared(LoadAware):
    name: str = "selects-undeclared"

    def select(self, pool: LargePool) -> Selected | None:
        return None


@dataclass
class TakesTurnsWithoutSelect:
    name: str = "turns-without-select"
    formula: ClassVar[str] = "-"
    needs: ClassVar[Needs] = Needs(turns=True)

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate], mean_load: float | None = None
               ) -> Choice | None:
        return Choice(0, (0.0,) * len(candidates))

    def turn(self, n: int) -> int:
        return 0


@pytest.mark.parametrize(("policy", "missing"), [
    (DeclaresFlooredOnly(), "Needs.floored without select"),
    (SelectsUndeclared(), "declares neither Needs.floored nor Needs.turns"),
    (TakesTurnsWithoutSelect(), "Needs.turns without select"),
])
def test_a_policy_lacking_what_it_declares_is_refused_when_made(policy: object, missing: str) -> None:
    with pytest.raises(ValueError, match=missing):
        check_capabilities(policy)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["lane-spread", "roundrobin", "loadaware", "banded", "kvaware", "leastload"])
def test_every_registered_policy_has_what_it_declares(name: str) -> None:
    policy = make_policy(name)
    assert check_capabilities(policy) is policy
    assert (policy.needs.floored or policy.needs.turns) == callable(getattr(policy, "select", None))


def test_the_builders_defaults_are_the_settings_tables() -> None:
    assert core_options(Settings()) == CoreOptions()
    flags = from_args(["--policy", "lane-spread", "--fallback-endpoints", "4", "--session-header", "x-session"],
                      environ={})
    options = core_options(flags)
    assert (options.policy, options.fallbacks, options.sessions) == ("lane-spread", 4, True)


def test_the_simulators_core_is_the_sidecars() -> None:
    """Ranking, health, models and fallbacks as a sidecar with no flags has them (the simulator's router used to
    leave them out)."""
    router = ProductRouter(make_policy("loadaware"), ["a:1", "b:1", "c:1"], lambda: 0.0, "exact")
    decider = router.decider
    assert decider.filters.health is not None and decider.filters.models is not None
    assert decider.selection.ranking is router.loads
    assert decider.selection.limit == 1 + Settings().fallback_endpoints
    router.exact.answer = {"b:1": 64}
    decision = router.decide(list(range(100)))
    assert decision.endpoint == "b:1" and len(decision.ranked) == 3
