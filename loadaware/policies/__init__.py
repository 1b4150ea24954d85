"""The routing policies and their registry: a policy is one module (its formula and parameters on top, its
Needs declared on its class) and one line in POLICIES. The default, `auto`, picks one of them at start
(auto.py). Each policy's optional capabilities are checked when it is registered (here, at import) and when it is
made, never mid-decision (`check_capabilities`)."""

from __future__ import annotations

from collections.abc import Callable

from loadaware.policies.banded import Banded
from loadaware.policies.base import Candidate, Choice, Needs, Policy, ranked
from loadaware.policies.kvaware import KvAware
from loadaware.policies.lane_spread import LaneSpread
from loadaware.policies.leastload import LeastLoad
from loadaware.policies.loadaware import LoadAware
from loadaware.policies.roundrobin import RoundRobin

# name -> the policy, from loadaware's beta (the one parameter a flag sets; the others ignore it)
POLICIES: dict[str, Callable[[float], Policy]] = {
    "banded": lambda beta: Banded(),
    "lane-spread": lambda beta: LaneSpread(),
    "loadaware": lambda beta: LoadAware(beta=beta),
    "kvaware": lambda beta: KvAware(),
    "roundrobin": lambda beta: RoundRobin(),
    "leastload": lambda beta: LeastLoad(),
}
POLICY_NAMES = tuple(POLICIES)

# What a policy that selects its own candidates over a large pool (policies/large_pool.py) must have, by the Needs
# flag that declares it.
CAPABILITIES = {
    "floored": ("select", "cost_in", "floor", "bounds", "prior", "max_share"),
    "turns": ("select", "turn"),
}


def check_capabilities(policy: Policy) -> Policy:
    """The policy, if what its Needs declare it has; else ValueError naming what is missing."""
    needs = policy.needs
    declared = [flag for flag in CAPABILITIES if getattr(needs, flag)]
    for flag in declared:
        missing = [name for name in CAPABILITIES[flag] if not hasattr(policy, name)]
        if missing:
            raise ValueError(f"policy {policy.name!r} declares Needs.{flag} without {', '.join(missing)}")
    if callable(getattr(policy, "select", None)) and not declared:
        raise ValueError(f"policy {policy.name!r} selects its own candidates (select) but declares neither "
                         f"Needs.floored nor Needs.turns")
    return policy


def make_policy(name: str, beta: float = 1.0) -> Policy:
    factory = POLICIES.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICIES)}")
    return check_capabilities(factory(beta))


for _factory in POLICIES.values():  # registration: a policy lacking what it declares fails at import
    check_capabilities(_factory(1.0))


__all__ = [
    "POLICIES",
    "POLICY_NAMES",
    "Banded",
    "Candidate",
    "Choice",
    "KvAware",
    "LaneSpread",
    "LeastLoad",
    "LoadAware",
    "Needs",
    "Policy",
    "RoundRobin",
    "check_capabilities",
    "make_policy",
    "ranked",
]
