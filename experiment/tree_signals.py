"""Candidates with the two signals only the peers' arms read: the KV blocks of the requests in flight and the
prompt tokens ever routed (a radix tree's view). The sidecar's pipeline builds plain candidates
(`loadaware.policies.base.Candidate`); the simulator widens them for an arm that declares it reads these
(`experiment.arms.Reads.tree_signals`), so the product carries no field that no product policy reads."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

from loadaware.policies.base import Candidate

_BASE_FIELDS = tuple(f.name for f in fields(Candidate))


@dataclass(slots=True)
class TreeCandidate(Candidate):
    kv_blocks: float = 0.0  # distinct KV blocks held by the requests in flight here (router's own count)
    routed_tokens: float = 0.0  # distinct prompt tokens ever routed here (an approximate radix tree's size)


Wide = TypeVar("Wide", bound=Candidate)


def widen(c: Candidate, cls: type[Wide], **extra: Any) -> Wide:
    """`c` as a `cls` (a subclass of Candidate) with the signals in `extra`, the others at their defaults."""
    values: dict[str, Any] = {name: getattr(c, name) for name in _BASE_FIELDS}
    return cls(**values, **extra)


def with_tree(c: Candidate, *, kv_blocks: float, routed_tokens: float) -> TreeCandidate:
    return widen(c, TreeCandidate, kv_blocks=kv_blocks, routed_tokens=routed_tokens)


def tree(c: Candidate) -> TreeCandidate:
    """`c` as a peer's arm sees it: itself when widened, else with neither signal (0)."""
    return c if isinstance(c, TreeCandidate) else widen(c, TreeCandidate)
