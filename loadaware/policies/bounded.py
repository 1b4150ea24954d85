"""The pile-up guard: no endpoint takes a request while it already carries half of the fleet's load.

    eligible(i) = load(i) + 1 <= ceil(MAX_SHARE x (total_load + 1))        in a pool of 3 or more endpoints
    MAX_SHARE = 0.5

total_load: the loads (requests in flight) of the pool's endpoints, this request included by the + 1. It is a
bin capacity in the manner of consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam, SODA
2018: each bin holds at most ceil(c x (m + 1) / n) of m + 1 balls), at c = n x MAX_SHARE: a preference (a prefix
match, a learned price, a tie-break) may concentrate a hot prefix on its holder, but never past half of the
fleet. The least-loaded endpoint always fits (its load is at most the mean), so the guard never leaves a
request without a candidate. A candidate past it is priced out, not dropped: it ranks after every eligible one.

Why so loose: a fleet runs near its capacity, and there any tighter bound (c x the mean, c = 1.25, 1.5 or 2 on
the configuration grid) forces prefix misses onto the other engines that cost more than the concentration they
prevent (docs/policies.md). With two endpoints half the load is an even split, so a two-endpoint pool is not
bounded: there the policy's own load terms are the only balance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from loadaware.policies.base import Candidate

MAX_SHARE = 0.5
MIN_POOL = 3  # smaller pools are not bounded
PRICED_OUT = 1e9  # added to the cost of a candidate past the bound: it ranks after every eligible one, and the
# fallbacks among the priced-out keep their own order (a finite number: scores are shown as JSON and protobuf)


def load_cap(candidates: Sequence[Candidate], share: float = MAX_SHARE) -> int | None:
    """The most requests an endpoint may carry, this one included (None: the pool is not bounded)."""
    return pool_cap(sum(x.load for x in candidates), len(candidates), share)


def pool_cap(total_load: float, pool_size: int, share: float = MAX_SHARE) -> int | None:
    """`load_cap` of a pool known by its total load and size (a pruned decision scores only part of its pool)."""
    if pool_size < MIN_POOL or share >= 1:
        return None
    return math.ceil(share * (total_load + 1))


def within_bound(candidates: Sequence[Candidate], share: float = MAX_SHARE) -> list[bool]:
    """Which candidates may take the request (all of them in a pool of fewer than MIN_POOL, or share >= 1)."""
    cap = load_cap(candidates, share)
    return [cap is None or x.load + 1 <= cap for x in candidates]


def bounded_costs(costs: list[float], candidates: Sequence[Candidate], share: float = MAX_SHARE) -> list[float]:
    """`costs` with the candidates past the bound priced out; unchanged when every one is eligible."""
    return priced_out(costs, candidates, load_cap(candidates, share))


def priced_out(costs: list[float], candidates: Sequence[Candidate], cap: int | None) -> list[float]:
    """`costs` with the candidates past `cap` (a pool's load_cap; None: unbounded) priced out."""
    if cap is None or max(x.load for x in candidates) + 1 <= cap:
        return costs
    return [x + past_cap(c.load, cap) for x, c in zip(costs, candidates)]


def past_cap(load: float, cap: int | None) -> float:
    """What the guard adds to the cost of an endpoint carrying `load`: PRICED_OUT past `cap`, else 0."""
    return PRICED_OUT if cap is not None and load + 1 > cap else 0.0
