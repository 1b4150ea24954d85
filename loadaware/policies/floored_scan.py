"""The scan a floored policy (Needs.floored: lane-spread) runs over a large pool: the endpoints it must score
beside its holders, in load order, until none left can rank among the choice and its fallbacks.

Candidates rank by (cost, -matched tokens, load, endpoint), as the policies' choice and fallbacks do; the scan
keeps the `limit` best keys so far and stops at a load whose `floor` puts every endpoint there after the
`limit`-th. Within a load, once `limit` keys are known, the rest are taken in the order's (endpoint) order while
(floor, load, endpoint) ranks before the `limit`-th key: all of them without `bound`, else IN_ORDER_FIRST of
them, and then the rest are weighed by their own bound (`bound(load)(endpoints, kth cost)`: the bounds at most
the `limit`-th cost) and built in (bound, endpoint) order while that pair, at this load, ranks before the
`limit`-th key.

Why nothing left out can be among the choice and its `limit - 1` fallbacks: an endpoint left out holds nothing,
and its cost is at least its bound, which is at least floor(its load) (the policy's bounds), so its key is at
least (its bound, 0, its load, its name); floor never falls as the load rises, and the `limit`-th key only falls
as the scan goes on; the scan stops only where every remaining key is at least the `limit`-th. Costs are
compared exactly (the policies treat costs within 1e-9 as tied). `cost`, `floor` and `bound` include the pile-up
guard's price. tests/unit/test_floored_pruning.py checks the choice and fallbacks against the full pool.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Collection, Iterable, Sequence

from loadaware.policies.base import Candidate

# A scan's endpoints of one load taken in the order's order before it weighs the rest by their bounds.
IN_ORDER_FIRST = 16

Bound = Callable[[float], Callable[[Sequence[str], float], list[tuple[float, str]]]]


class FlooredScan:
    """One scan. `leave`: the endpoints already scored; `in_pool(endpoint)`: may it be chosen; `build(endpoint,
    load)`: its candidate; `cost(candidate)`, `floor(load)`, `bound(load)`: the policy's prices."""

    def __init__(self, leave: Collection[str], in_pool: Callable[[str], bool], limit: int,
                 build: Callable[[str, float], Candidate], cost: Callable[[Candidate], float],
                 floor: Callable[[float], float]) -> None:
        self.leave, self.in_pool, self.limit = leave, in_pool, limit
        self.build, self.cost, self.floor = build, cost, floor
        self.best: list[tuple[float, int, float, str]] = []  # the `limit` best keys so far, ascending
        self.out: list[Candidate] = []
        self.costs: list[float] = []

    def keep(self, c: Candidate, x: float) -> None:
        key = (x, -c.matched_tokens, c.load, c.endpoint)
        best = self.best
        if len(best) < self.limit:
            bisect.insort(best, key)
        elif key < best[-1]:
            bisect.insort(best, key)
            best.pop()

    def take(self, ep: str, load: float) -> None:
        if ep in self.leave or not self.in_pool(ep):
            return
        c = self.build(ep, load)
        x = self.cost(c)
        self.out.append(c)
        self.costs.append(x)
        self.keep(c, x)

    def run(self, scored: Sequence[Candidate], scored_costs: Sequence[float],
            by_load: Iterable[tuple[float, Sequence[str]]], bound: Bound | None = None
            ) -> tuple[list[Candidate], list[float]]:
        """Scan the loads least first; returns the scanned and their costs."""
        for c, x in zip(scored, scored_costs):
            self.keep(c, x)
        for load, bucket in by_load:
            if not self.bucket(load, bucket, bound):
                break
        return self.out, self.costs

    def bucket(self, load: float, bucket: Sequence[str], bound: Bound | None) -> bool:
        """The endpoints at one load that can still rank; False: none at this load or above can."""
        best, lowest = self.best, self.floor(load)
        i, n = 0, len(bucket)
        while i < n and len(best) < self.limit:  # until `limit` keys are known, in the order's order
            self.take(bucket[i], load)
            i += 1
        if i >= n:
            return True
        if (lowest, 0, load) > best[-1][:3]:
            return False
        # A few more in the order's order first: at the prior's prices the first idle endpoint settles the load.
        first = n if bound is None else min(n, i + IN_ORDER_FIRST)
        while i < first:
            if (lowest, 0, load, bucket[i]) >= best[-1]:
                return False
            self.take(bucket[i], load)
            i += 1
        if i < n and bound is not None:
            self.weighed(load, bound(load)(bucket[i:], best[-1][0]))
        return True

    def weighed(self, load: float, bounds: list[tuple[float, str]]) -> None:
        """The rest of a load's endpoints in (bound, endpoint) order while they can rank."""
        heapq.heapify(bounds)
        while bounds and (bounds[0][0], 0, load, bounds[0][1]) < self.best[-1]:
            self.take(heapq.heappop(bounds)[1], load)
