"""The routing policies and their registry: a policy is one module (its formula and parameters on top, its
Needs declared on its class) and one line in POLICIES. The default, `auto`, picks one of them at start
(auto.py)."""

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


def make_policy(name: str, beta: float = 1.0) -> Policy:
    factory = POLICIES.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICIES)}")
    return factory(beta)


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
    "make_policy",
    "ranked",
]
