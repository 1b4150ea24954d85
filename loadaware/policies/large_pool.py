"""A large pool as a policy's own candidate selection reads it: the optional `select` capability.

A policy that declares Needs.floored or Needs.turns chooses over a large pool (at least MIN_POOL endpoints,
routing/pruning.py) without scoring every endpoint, by its own rule: lane-spread scans in load order until its
cost floor passes the best costs found (policies/lane_spread.py), round robin scores only its turn and the least
loaded (policies/roundrobin.py). Its `select(pool)` returns (candidates in pool order, the choice, the pool's
mean load or None) or None to let the pipeline score the pool as usual. The pipeline builds the pool
(routing/large_pool.py); the policy reads it through this interface only, so it stays pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from loadaware.policies.base import Candidate, Choice
from loadaware.policies.ttft_model import Prices

Selected = tuple[tuple[Candidate, ...], Choice, float | None]


class LargePool(Protocol):
    prompt_tokens: int  # the prompt's length (estimated when only its head was tokenized)
    limit: int  # the choice and its fallbacks: how many must rank exactly
    size: int  # the pool's endpoints, less the excluded
    keep: str | None  # an endpoint to score whatever its load (the session's sticky endpoint)
    whole: bool  # the pool is the whole fleet, nobody excluded
    signals: bool  # candidates carry token signals (a signal tracker is wired)

    def ordered(self) -> bool:
        """Is the fleet's load order current (it holds exactly the fleet)? False: score the pool as usual."""
        ...

    def total_load(self) -> float: ...

    def lexical(self) -> tuple[str, ...]: ...

    def position(self, endpoint: str) -> int: ...

    def load(self, endpoint: str) -> float: ...

    def least(self, n: int, skip: Callable[[str], bool]) -> list[str]:
        """The `n` least-loaded endpoints of the fleet's load order that `skip` does not leave out."""
        ...

    def by_load(self) -> Iterable[tuple[float, Sequence[str]]]:
        """The fleet's endpoints grouped by load, least first."""
        ...

    def in_pool(self, endpoint: str) -> bool: ...

    def must_score(self) -> dict[str, int]:
        """endpoint -> its matched tokens, for every endpoint of the pool that holds some of the prompt or that
        must be scored whatever its load (prices learned since last read, engines a queued prompt may credit, the
        session's endpoint)."""
        ...

    def all_queue(self) -> bool:
        """Does every endpoint of the pool queue (a fresh scrape with waiting > 0)?"""
        ...

    def candidate(self, endpoint: str, matched: int, load: float) -> Candidate: ...

    def credit(self, candidates: Sequence[Candidate]) -> None:
        """Queued-prefix credit on the candidates (prefix/queued.py), for a policy that reads it."""
        ...

    def working_view(self, candidates: Sequence[Candidate]) -> tuple[float | None, float]:
        """(the fleet's cache demand, the prompt's held prefix's popularity), (None, 0) when unknown."""
        ...

    def fill_working_set(self, candidates: Sequence[Candidate],
                         view: tuple[float | None, float] | None = None) -> None:
        """The working set's view (`view`, else computed) on every candidate, for a policy that reads it."""
        ...

    def mark_read(self, candidates: Sequence[Candidate]) -> None:
        """The candidates' learned prices were read (they need not be scored again for being new)."""
        ...

    def price_floor(self, prior: Prices) -> Prices: ...

    def prices_of(self, endpoint: str) -> Prices | None: ...
