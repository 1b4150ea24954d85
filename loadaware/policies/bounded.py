"""Bounded load: no endpoint takes a request while it already carries more than its share of the pool.

    eligible(i) = load(i) + 1 <= ceil(c x (total_load + 1) / n)        c = LOAD_BOUND = 1.25

total_load: the loads of the n endpoints of the pool (candidates, or the whole pool when the candidates are a
pruned part of it: n x its mean). This is consistent hashing with bounded loads (Mirrokni, Thorup and
Zadimoghaddam, SODA 2018): each bin's capacity is ceil(c x (m + 1) / n) for the (m + 1)-th ball, so whatever a
preference says (a prefix match, a learned price, a tie-break), no endpoint takes more than c times the mean;
with c = 1 + epsilon the search for an eligible bin stays short and the preference keeps its hits. The
least-loaded endpoint is always eligible (its load is at most the mean), so the bound never leaves a request
without a candidate.

Why a hard bound and not a weight: a cost that prices a hit as (almost) free, when its source credits tokens the
engine must load back or that only the first registered holder is credited with (stock LMCache), keeps sending a
hot prefix to one engine however long its batch grows. The bound is the guard that no such signal can pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from loadaware.policies.base import Candidate

LOAD_BOUND = 1.25


def within_bound(candidates: Sequence[Candidate], c: float = LOAD_BOUND, mean_load: float | None = None) -> list[bool]:
    """Which candidates may take the request. `mean_load`: the pool's mean when the candidates are part of it."""
    n = len(candidates)
    if n == 0 or math.isinf(c):
        return [True] * n
    mean = sum(x.load for x in candidates) / n if mean_load is None else mean_load
    cap = math.ceil(c * (mean * n + 1) / n)
    return [x.load + 1 <= cap for x in candidates]


PRICED_OUT = 1e9  # added to the cost of a candidate past the bound: it ranks after every eligible one, and the
# fallbacks among the priced-out keep their own order (a finite number: scores are shown as JSON and protobuf)


def bounded_costs(costs: list[float], candidates: Sequence[Candidate], c: float = LOAD_BOUND,
                  mean_load: float | None = None) -> list[float]:
    """`costs` with the candidates past the bound priced out; unchanged when every one is eligible."""
    ok = within_bound(candidates, c, mean_load)
    if all(ok):
        return costs
    return [x if fits else x + PRICED_OUT for x, fits in zip(costs, ok)]
