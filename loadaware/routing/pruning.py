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
`tests/unit/test_pruning.py` checks the choice and the ranked fallbacks against the full set. A policy that
selects its own candidates over a large pool (lane-spread's floored scan, round robin's turn) does so through
policies/large_pool.py.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

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
