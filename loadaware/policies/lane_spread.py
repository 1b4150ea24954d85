"""`lane`, spreading a popular prefix while the fleet's caches have room for more copies of it.

    cost(i) = ttft(i) x (load(i) + 1) + per_token(i) x uncached(i) x waiting(i)    while spreading
    cost(i) = lane's cost(i)                                                       otherwise
    spreading: cache_demand < 1 and prefix_routes >= the number of candidates

ttft, per_token, uncached, waiting: as in `lane` (loadaware/policies/lane.py). load(i): the requests in flight
on i, queued and prefilling ones included, where `lane` weighs only the decode batch, (decode(i) + 1)^0.75.
Counting every request in flight moves the next request for a hot prefix to another engine as soon as the
holder has a queue, so the prefix gets a second copy during a burst instead of a queue; the price is that
copy's room in a cache. That room is free while the fleet's recurring working set (cache_demand: the blocks
routed again while recent, over the fleet's KV capacity, loadaware/prefix/working_set.py) fits in its caches
once, and a copy pays for itself only when the prefix serves many later requests (prefix_routes: how often its
held prefix was routed lately). While new prompt heads are still arriving, cache_demand is None and the
policy is `lane`: a cold start must not spend the caches on copies before it knows the working set.

matched tokens: the exact sources' match, and on an engine that queues (scraped waiting > 0) at least what the
requests routed there while it queued hold of the prompt (Needs.queued_prefixes, loadaware/prefix/queued.py):
they are prefilled before this one is scheduled, so a later request for a new or evicted prefix follows the
first one into the same queue instead of computing the prefix again on another engine.

While every endpoint queues (scraped waiting > 0 on each), the choice is the seed's `loadaware` (beta 1) over
the same candidates, queued credit included (rule `all_queueing`). There a request's first token waits mostly
for a batch slot to free, and lane's price does not see that wait: the decode batch is at the engines' limit on
every one of them, and the prefill clock counts routed prefill, not the admission queue ahead of it; so a hit
went to its holder whatever that holder's queue, and the queues drifted apart. Balancing requests in flight,
with the match as a bonus of at most one mean load, keeps the queues even (research/notebook.md).

Over a large pool it selects its own candidates (`select`, policies/large_pool.py): the holders, then the rest by
load only until `floor` (a lower bound on a non-holder's cost) passes the best costs found (Needs.floored,
policies/floored_scan.py); while the whole pool queues, the holders and the least loaded, as loadaware's pruning
does (routing/pruning.py says why that is enough for loadaware's choice).

How it fares against `lane` and the peers is in research/notebook.md and docs/results.md (figures live there, not
here); no constant is tuned per workload: the thresholds are the fleet's capacity (1) and its size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from loadaware.policies.base import Candidate, Choice, Needs, lowest_cost
from loadaware.policies.bounded import MAX_SHARE, load_cap, past_cap, pool_cap, priced_out
from loadaware.policies.floored_scan import Bound, FlooredScan
from loadaware.policies.lane import Lane
from loadaware.policies.large_pool import LargePool, Selected
from loadaware.policies.loadaware import LoadAware
from loadaware.policies.ttft_model import Prices

ALL_QUEUEING = "all_queueing"  # the rule that chose while every candidate queued (Choice.rule)


def spreading(candidates: Sequence[Candidate], pool_size: int | None = None) -> bool:
    """Do the fleet's caches have room for another copy of this prompt's prefix, and is it popular enough?
    `pool_size`: the pool's endpoints when the candidates are only part of it (routing/pruning.py)."""
    if not candidates:
        return False
    first = candidates[0]
    demand = first.cache_demand
    size = len(candidates) if pool_size is None else pool_size
    return demand is not None and demand < 1.0 and first.prefix_routes >= size


def all_queueing(candidates: Sequence[Candidate]) -> bool:
    """Does every candidate have an admission queue (scraped waiting > 0)?"""
    return bool(candidates) and all(c.waiting > 0 for c in candidates)


@dataclass
class LaneSpread(Lane):
    name: str = "lane-spread"
    formula: ClassVar[str] = (
        "cost(i) = (lane_wait(i) + per_token(i) x uncached(i) + base(i) + per_running(i) x load(i)) x (load(i) "
        "+ 1) + per_token(i) x uncached(i) x waiting(i) while the fleet's recurring working set fits its KV "
        "caches (cache_demand < 1) and the prompt's held prefix was routed at least once per candidate "
        "lately (prefix_routes); lane's cost otherwise; a queueing endpoint's matched tokens include what the "
        "requests routed there while it queued hold of the prompt; lowest wins among the endpoints that carry "
        f"less than {MAX_SHARE:g} of the pool's load (pools of 3 or more); while every endpoint queues (scraped "
        "waiting > 0), loadaware (beta 1) chooses instead")
    needs: ClassVar[Needs] = Needs(signals=True, working_set=True, queued_prefixes=True, floored=True)
    max_share: float = MAX_SHARE  # the pile-up guard (loadaware/policies/bounded.py); 1: off
    when_all_queue: LoadAware = field(default_factory=LoadAware)  # the seed's policy, beta 1

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate], mean_load: float | None = None
               ) -> Choice | None:
        if not candidates:
            return None
        if all_queueing(candidates):
            balanced = self.when_all_queue.choose(prompt_tokens, candidates, mean_load)
            assert balanced is not None  # it has candidates
            return Choice(balanced.index, balanced.scores, ALL_QUEUEING)
        return self.cheapest(prompt_tokens, candidates)

    def cheapest(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> Choice:
        """The lowest cost among the candidates within the pile-up guard (the rule while some endpoint has a free
        slot)."""
        costs = self.costs(prompt_tokens, candidates)
        return lowest_cost(priced_out(costs, candidates, load_cap(candidates, self.max_share)), candidates)

    def costs(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
        spread = spreading(candidates)
        return [self.cost_in(prompt_tokens, c, spread) for c in candidates]

    def cost_in(self, prompt_tokens: int, c: Candidate, spread: bool) -> float:
        """c's cost, spreading or not."""
        return in_flight_cost(self, prompt_tokens, c) if spread else self.cost(prompt_tokens, c)

    def floor(self, prompt_tokens: int, load: float, prices: Prices, spread: bool) -> float:
        """A lower bound on the cost of an endpoint that holds nothing of the prompt, carries `load` and prices
        a request at no less than `prices` (base, per token, per running): its wait, decode batch and queue are
        at least 0. Summed in the cost's own order, so rounding cannot lift it above that cost."""
        base, per_token, per_running = prices
        return (per_token * prompt_tokens + base + per_running * load) * (load + 1 if spread else 1.0)

    def bounds(self, prompt_tokens: int, load: float, spread: bool, endpoints: Sequence[str],
               prices_of: Callable[[str], Prices | None], prior: Prices, kth: float, extra: float = 0.0
               ) -> list[tuple[float, str]]:
        """Of `endpoints` (each carrying `load`), (its `floor` at its own prices + `extra`, the endpoint) where
        that is at most `kth`; `prices_of(endpoint)`: its prices (None: the prior's). `floor` inlined: a large
        pool's scan weighs thousands at once (routing/pruning.py)."""
        factor = load + 1 if spread else 1.0
        return [(b, ep) for ep in endpoints
                if (b := ((p := prices_of(ep) or prior)[1] * prompt_tokens + p[0] + p[2] * load) * factor + extra)
                <= kth]


    def select(self, pool: LargePool) -> Selected | None:
        """Its candidates over a large pool (policies/large_pool.py): while every endpoint queues, its holders and
        the least loaded of the rest, chosen as loadaware; else the floored scan. None: score the pool as usual."""
        if not pool.signals or not pool.ordered():
            return None
        must = pool.must_score()
        if pool.all_queue():
            return self._all_queueing(pool, must)
        return self._floored(pool, must)

    def _all_queueing(self, pool: LargePool, must: dict[str, int]) -> Selected | None:
        """While every endpoint queues the choice is loadaware's: its holders and the least loaded of the rest are
        all that can rank (routing/pruning.py), each of them queueing."""
        least = pool.least(pool.limit, lambda ep: ep in must or not pool.in_pool(ep))
        candidates = tuple(pool.candidate(ep, must.get(ep, 0), pool.load(ep))
                           for ep in sorted((*must, *least), key=pool.position))
        pool.credit(candidates)
        pool.fill_working_set(candidates)
        mean = pool.total_load() / pool.size
        choice = self.choose(pool.prompt_tokens, candidates, mean)
        return (candidates, choice, mean) if choice is not None else None

    def _floored(self, pool: LargePool, must: dict[str, int]) -> Selected:
        """The holders and whom they must score, then the floored scan (policies/floored_scan.py); the choice is
        the lowest cost over them, in pool order."""
        size = pool.size
        scored = [pool.candidate(ep, matched, pool.load(ep)) for ep, matched in must.items()]
        pool.mark_read(scored)
        pool.credit(scored)
        demand, routes = pool.working_view(scored)
        spread = demand is not None and demand < 1.0 and routes >= size
        total = pool.total_load()
        cost, floor, bound = self._prices(pool, spread, pool_cap(total, size, self.max_share))
        scored_costs = [cost(c) for c in scored]
        scan = FlooredScan(must, pool.in_pool, pool.limit, lambda ep, load: pool.candidate(ep, 0, load), cost, floor)
        rest, rest_costs = scan.run(scored, scored_costs, pool.by_load(), bound)
        position = pool.position
        pairs = sorted(zip((*scored, *rest), (*scored_costs, *rest_costs)),
                       key=lambda pair: position(pair[0].endpoint))
        candidates = tuple(c for c, _ in pairs)
        pool.fill_working_set(candidates, (demand, routes))
        return candidates, lowest_cost([x for _, x in pairs], candidates), total / size

    def _prices(self, pool: LargePool, spread: bool, cap: int | None
                ) -> tuple[Callable[[Candidate], float], Callable[[float], float], Bound]:
        """(cost of a candidate, floor at a load at the fleet's lowest prices, bounds of endpoints at a load at
        their own prices), the pile-up guard's price included."""
        n_tokens = pool.prompt_tokens
        prior = self.prior.prices()
        lowest = pool.price_floor(prior)
        read = pool.prices_of

        def cost(c: Candidate) -> float:
            return self.cost_in(n_tokens, c, spread) + past_cap(c.load, cap)

        def floor(load: float) -> float:  # any endpoint's, at the lowest prices
            return self.floor(n_tokens, load, lowest, spread) + past_cap(load, cap)

        def bound(load: float) -> Callable[[Sequence[str], float], list[tuple[float, str]]]:
            extra = past_cap(load, cap)
            return lambda eps, kth: self.bounds(n_tokens, load, spread, eps, read, prior, kth, extra)

        return cost, floor, bound


def in_flight_costs(lane: Lane, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
    """`lane`'s costs with the in-flight factor (load + 1) in place of its decode factor."""
    return [in_flight_cost(lane, prompt_tokens, c) for c in candidates]


def in_flight_cost(lane: Lane, prompt_tokens: int, c: Candidate) -> float:
    """`lane`'s cost of c with the in-flight factor (load + 1) in place of its decode factor."""
    own = lane.own_prefill_s(prompt_tokens, c)
    return lane._ttft_after(own, c) * (c.load + 1) + own * c.waiting
