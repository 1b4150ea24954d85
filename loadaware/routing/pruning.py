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

import heapq
from collections.abc import Callable, Collection, Mapping, Sequence

from loadaware.load.order import LoadOrder
from loadaware.policies import Candidate

# Below this many endpoints scoring them all costs less than choosing which to score.
MIN_POOL = 64


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
                       floor: Callable[[float], float], bound: Callable[[float], Callable[[str], float]] | None = None
                       ) -> tuple[list[Candidate], list[float]]:
    """The endpoints a floored policy (Needs.floored) must score beside `scored` (its holders and the few it
    always scores, whose costs are `scored_costs`), least loaded first: each one of `members` not in `leave`
    (the scored) nor in `excluded`, until `floor(load)` reaches the `limit`-th lowest cost found among the
    scanned and the scored holders (matched tokens > 0); on the way, an endpoint whose own bound
    (`bound(load)(endpoint)`) already reaches it is passed over unbuilt. Returns the scanned and their costs.

    Why nothing left out can be among the choice and its `limit - 1` fallbacks: an endpoint left out holds
    nothing, so its cost is at least its bound, which is at least floor(its load) (the policy's bounds), and
    floor never falls as the load rises, so it is at least that `limit`-th cost; at equal cost it ranks after
    each of those `limit` (a holder by its longer match, a scanned endpoint by its lower load or, at equal
    load, its lexically smaller name: the order's). `cost`, `floor` and `bound` include the pile-up guard's
    price. `build(endpoint, load)`: its candidate."""
    worst: list[float] = []  # the `limit` lowest costs so far, negated (a max-heap)
    for c, x in zip(scored, scored_costs):
        if c.matched_tokens > 0:
            _keep_lowest(worst, x, limit)
    out: list[Candidate] = []
    costs: list[float] = []
    for load, bucket in order.by_load():
        lowest = floor(load)
        if len(worst) >= limit and lowest >= -worst[0]:
            break
        own = bound(load) if bound is not None else None
        for ep in bucket:
            if ep in leave or ep not in members or ep in excluded:
                continue
            if len(worst) >= limit:
                kth = -worst[0]
                if lowest >= kth:
                    return out, costs
                if own is not None and own(ep) >= kth:
                    continue
            c = build(ep, load)
            x = cost(c)
            out.append(c)
            costs.append(x)
            _keep_lowest(worst, x, limit)
    return out, costs


def _keep_lowest(worst: list[float], x: float, limit: int) -> None:
    if len(worst) < limit:
        heapq.heappush(worst, -x)
    elif x < -worst[0]:
        heapq.heapreplace(worst, -x)


def round_robin_candidates(order: LoadOrder, pick: str, limit: int, position: Callable[[str], int]
                           ) -> tuple[tuple[Candidate, ...], int, tuple[float, ...]]:
    """Round robin over the whole fleet: the endpoint whose turn it is (found in the fleet's lexical order)
    scores 1 and every other 0, so its fallbacks are the least-loaded others (ties: lexical), as over the full
    pool. Returns (candidates in pool order, the pick's index, the scores)."""
    chosen = sorted((pick, *order.least(limit - 1, pick.__eq__)), key=position)
    candidates = tuple(Candidate(ep, 0, order.load(ep) or 0.0) for ep in chosen)
    index = chosen.index(pick)
    return candidates, index, tuple(1.0 if i == index else 0.0 for i in range(len(chosen)))
