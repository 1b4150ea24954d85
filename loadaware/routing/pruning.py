"""The candidates a decision needs to score, when the fleet is large: the endpoints that hold some of the
prompt, plus the few least-loaded of the rest (docs/architecture.md, "Fleet size").

Why that is enough, for the policies that declare Needs.prunable: an endpoint that holds nothing of the prompt
scores by its load alone (loadaware: -beta * relative_load, kvaware: 0 when anyone matches, else -load; leastload:
-load),
and ties among such endpoints break on the lower load, then the lexically smaller name. So among them the
ranking is (load, endpoint) ascending, and the choice plus its `limit - 1` fallbacks can include at most
`limit` of them: the first `limit` in that order. Every holder is scored as before; loadaware's mean load is
the whole pool's (the load order's running sum), not the pruned set's. The candidates keep the pool's order,
so ties closer than the policies' float tolerance resolve as they do over the full set.
`tests/unit/test_pruning.py` checks the choice and the ranked fallbacks against the full set.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Collection, Mapping, Sequence

from loadaware.load.order import LoadOrder
from loadaware.policies import Candidate

# Below this many endpoints scoring them all costs less than choosing which to score.
MIN_POOL = 64
# A floored scan's endpoints of one load taken in the order's order before it weighs the rest by their bounds.
IN_ORDER_FIRST = 16


def pruned_candidates(order: LoadOrder, pool: tuple[str, ...], members: Collection[str], whole_fleet: bool,
                      matches: Mapping[str, int], prompt_tokens: int, limit: int,
                      position: Callable[[str], int], excluded: Collection[str] = frozenset(),
                      keep: str | None = None) -> tuple[tuple[Candidate, ...], float]:
    """(candidates in pool order, the pool's mean load). The pool is `pool` less `excluded` (engines failing
    their requests, a few); `members`: `pool` as a set; `whole_fleet`: `pool` is every endpoint of the load
    order (the common case: its running sum, less the excluded, is the pool's). `keep`: an endpoint scored
    whatever its load when it is in the pool (a session's sticky endpoint, routing/affinity.py)."""
    held = {ep: min(n, prompt_tokens) for ep, n in matches.items()
            if n > 0 and ep in members and ep not in excluded}
    if keep is not None and keep not in held and keep in members and keep not in excluded:
        # Scored like a holder of nothing, on top of the `limit` least loaded: it ranks after all of them, so
        # the policy's choice and fallbacks are unchanged, and the decider can still prefer it.
        held[keep] = 0
    load_of = order.load
    size = len(pool) - len(excluded)
    total = pool_load(order, pool, whole_fleet, excluded)
    if whole_fleet:
        rest = order.least(limit, lambda ep: ep in held or ep in excluded) if excluded else \
            order.least(limit, held.__contains__)
    else:
        rest = order.least(limit, lambda ep: ep in held or ep not in members or ep in excluded)
    mean = total / size if size > 0 else 0.0
    chosen = sorted((*held, *rest), key=position)
    candidates = tuple(Candidate(ep, held.get(ep, 0), load_of(ep) or 0.0) for ep in chosen)
    return candidates, mean


def pool_load(order: LoadOrder, pool: tuple[str, ...], whole_fleet: bool, excluded: Collection[str]) -> float:
    """The total load of `pool` less `excluded` (`whole_fleet`: the pool is every endpoint of the order, whose
    running sum it is then)."""
    load_of = order.load
    if whole_fleet:
        total = order.total
    else:
        total = 0.0
        for ep in pool:
            total += load_of(ep) or 0.0
    return total - sum(load_of(ep) or 0.0 for ep in excluded)


def floored_candidates(order: LoadOrder, leave: Collection[str], members: Collection[str],
                       excluded: Collection[str], scored: Sequence[Candidate], scored_costs: Sequence[float],
                       limit: int, build: Callable[[str, float], Candidate], cost: Callable[[Candidate], float],
                       floor: Callable[[float], float],
                       bound: Callable[[float], Callable[[Sequence[str], float], list[tuple[float, str]]]] | None
                       = None) -> tuple[list[Candidate], list[float]]:
    """The endpoints a floored policy (Needs.floored) must score beside `scored` (its holders and the few it
    always scores, whose costs are `scored_costs`): of `members`, not in `leave` (the scored) nor in
    `excluded`, least loaded first. Candidates rank by (cost, -matched tokens, load, endpoint), as the policies'
    choice and fallbacks do; the scan keeps the `limit` best keys so far and stops at a load whose `floor`
    puts every endpoint there after the `limit`-th. Within a load, once `limit` keys are known, the rest are
    taken in the order's (endpoint) order while (floor, load, endpoint) ranks before the `limit`-th key: all of
    them without `bound`, else IN_ORDER_FIRST of them, and then the rest are weighed by their own bound
    (`bound(load)(endpoints, kth cost)`: the bounds at most the `limit`-th cost) and built in (bound, endpoint)
    order while that pair, at this load, ranks before the `limit`-th key. Returns the scanned and their costs.

    Why nothing left out can be among the choice and its `limit - 1` fallbacks: an endpoint left out holds
    nothing, and its cost is at least its bound, which is at least floor(its load) (the policy's bounds), so
    its key is at least (its bound, 0, its load, its name); floor never falls as the load rises, and the
    `limit`-th key only falls as the scan goes on; the scan stops only where every remaining key is at least
    the `limit`-th. Costs are compared exactly (the policies treat costs within 1e-9 as tied). `cost`, `floor`
    and `bound` include the pile-up guard's price. `build(endpoint, load)`: its candidate."""
    best: list[tuple[float, int, float, str]] = []  # the `limit` best keys so far, ascending

    def keep(c: Candidate, x: float) -> None:
        key = (x, -c.matched_tokens, c.load, c.endpoint)
        if len(best) < limit:
            bisect.insort(best, key)
        elif key < best[-1]:
            bisect.insort(best, key)
            best.pop()

    for c, x in zip(scored, scored_costs):
        keep(c, x)
    out: list[Candidate] = []
    costs: list[float] = []

    def take(ep: str, load: float) -> None:
        c = build(ep, load)
        x = cost(c)
        out.append(c)
        costs.append(x)
        keep(c, x)

    for load, bucket in order.by_load():
        lowest = floor(load)
        i, n = 0, len(bucket)
        while i < n and len(best) < limit:  # until `limit` keys are known, in the order's order
            ep = bucket[i]
            i += 1
            if ep not in leave and ep in members and ep not in excluded:
                take(ep, load)
        if i >= n:
            continue
        if (lowest, 0, load) > best[-1][:3]:
            break
        # A few more in the order's order first: at the prior's prices the first idle endpoint settles the load.
        first = n if bound is None else min(n, i + IN_ORDER_FIRST)
        while i < first:
            ep = bucket[i]
            if (lowest, 0, load, ep) >= best[-1]:
                return out, costs
            i += 1
            if ep not in leave and ep in members and ep not in excluded:
                take(ep, load)
        if i >= n or bound is None:
            continue
        weighed = bound(load)(bucket[i:], best[-1][0])
        heapq.heapify(weighed)
        while weighed and (weighed[0][0], 0, load, weighed[0][1]) < best[-1]:
            ep = heapq.heappop(weighed)[1]
            if ep not in leave and ep in members and ep not in excluded:
                take(ep, load)
    return out, costs


def round_robin_candidates(order: LoadOrder, pick: str, limit: int, position: Callable[[str], int]
                           ) -> tuple[tuple[Candidate, ...], int, tuple[float, ...]]:
    """Round robin over the whole fleet: the endpoint whose turn it is (found in the fleet's lexical order)
    scores 1 and every other 0, so its fallbacks are the least-loaded others (ties: lexical), as over the full
    pool. Returns (candidates in pool order, the pick's index, the scores)."""
    chosen = sorted((pick, *order.least(limit - 1, pick.__eq__)), key=position)
    candidates = tuple(Candidate(ep, 0, order.load(ep) or 0.0) for ep in chosen)
    index = chosen.index(pick)
    return candidates, index, tuple(1.0 if i == index else 0.0 for i in range(len(chosen)))
