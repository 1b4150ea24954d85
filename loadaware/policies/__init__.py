"""Pure scoring functions. The formula lives in loadaware.py."""

from __future__ import annotations

from loadaware.policies.base import Candidate, Choice, Policy, ranked
from loadaware.policies.kvaware import KvAware
from loadaware.policies.lane import Lane
from loadaware.policies.lane_spread import LaneSpread
from loadaware.policies.leastload import LeastLoad
from loadaware.policies.loadaware import LoadAware
from loadaware.policies.predictive import Predictive
from loadaware.policies.roundrobin import RoundRobin

POLICY_NAMES = ("loadaware", "kvaware", "roundrobin", "leastload", "predictive", "lane", "lane-spread")


def make_policy(name: str, beta: float = 1.0) -> Policy:
    if name == "loadaware":
        return LoadAware(beta=beta)
    if name == "kvaware":
        return KvAware()
    if name == "roundrobin":
        return RoundRobin()
    if name == "leastload":
        return LeastLoad()
    if name == "predictive":
        return Predictive()
    if name == "lane":
        return Lane()
    if name == "lane-spread":
        return LaneSpread()
    raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICY_NAMES)}")


__all__ = [
    "POLICY_NAMES",
    "Candidate",
    "Choice",
    "KvAware",
    "Lane",
    "LaneSpread",
    "LeastLoad",
    "LoadAware",
    "Policy",
    "Predictive",
    "RoundRobin",
    "make_policy",
    "ranked",
]
