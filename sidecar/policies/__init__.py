"""Pure scoring functions. The formula lives in loadaware.py."""

from __future__ import annotations

from .base import Candidate, Choice, Policy
from .kvaware import KvAware
from .leastload import LeastLoad
from .loadaware import LoadAware
from .roundrobin import RoundRobin

POLICY_NAMES = ("loadaware", "kvaware", "roundrobin", "leastload")


def make_policy(name: str, beta: float = 1.0) -> Policy:
    if name == "loadaware":
        return LoadAware(beta=beta)
    if name == "kvaware":
        return KvAware()
    if name == "roundrobin":
        return RoundRobin()
    if name == "leastload":
        return LeastLoad()
    raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICY_NAMES)}")


__all__ = ["Candidate", "Choice", "Policy", "LoadAware", "KvAware", "LeastLoad", "RoundRobin",
           "POLICY_NAMES", "make_policy"]
