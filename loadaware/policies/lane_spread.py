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

Over a large pool the pipeline scores the holders and then the rest by load only until `floor` (a lower bound on
a non-holder's cost) passes the best costs found (Needs.floored, routing/pruning.py).

How it fares against `lane` and the peers is in docs/findings.md and docs/results.md (figures live there, not
here); no constant is tuned per workload: the thresholds are the fleet's capacity (1) and its size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from loadaware.policies.base import Candidate, Choice, Needs, lowest_cost
from loadaware.policies.bounded import MAX_SHARE, load_cap, priced_out
from loadaware.policies.lane import Lane
from loadaware.policies.ttft_model import Prices


def spreading(candidates: Sequence[Candidate], pool_size: int | None = None) -> bool:
    """Do the fleet's caches have room for another copy of this prompt's prefix, and is it popular enough?
    `pool_size`: the pool's endpoints when the candidates are only part of it (routing/pruning.py)."""
    if not candidates:
        return False
    first = candidates[0]
    demand = first.cache_demand
    size = len(candidates) if pool_size is None else pool_size
    return demand is not None and demand < 1.0 and first.prefix_routes >= size


@dataclass
class LaneSpread(Lane):
    name: str = "lane-spread"
    formula: ClassVar[str] = (
        "cost(i) = (lane_wait(i) + per_token(i) x uncached(i) + base(i) + per_running(i) x load(i)) x (load(i) "
        "+ 1) + per_token(i) x uncached(i) x waiting(i) while the fleet's recurring working set fits its KV "
        "caches (cache_demand < 1) and the prompt's held prefix was routed at least once per candidate "
        "lately (prefix_routes); lane's cost otherwise; a queueing endpoint's matched tokens include what the "
        "requests routed there while it queued hold of the prompt; lowest wins among the endpoints that carry "
        f"less than {MAX_SHARE:g} of the pool's load (pools of 3 or more)")
    needs: ClassVar[Needs] = Needs(signals=True, working_set=True, queued_prefixes=True, floored=True)
    max_share: float = MAX_SHARE  # the pile-up guard (loadaware/policies/bounded.py); 1: off

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate], mean_load: float | None = None
               ) -> Choice | None:
        if not candidates:
            return None
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
        at least 0."""
        w = self.floor_weights(prompt_tokens, load, spread)
        return prices[0] * w[0] + prices[1] * w[1] + prices[2] * w[2]

    def floor_weights(self, prompt_tokens: int, load: float, spread: bool) -> Prices:
        """`floor` is linear in the prices: these are its weights at one prompt and load (a scan weighs each
        endpoint's own prices with them)."""
        factor = load + 1 if spread else 1.0
        return factor, prompt_tokens * factor, load * factor


def in_flight_costs(lane: Lane, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
    """`lane`'s costs with the in-flight factor (load + 1) in place of its decode factor."""
    return [in_flight_cost(lane, prompt_tokens, c) for c in candidates]


def in_flight_cost(lane: Lane, prompt_tokens: int, c: Candidate) -> float:
    """`lane`'s cost of c with the in-flight factor (load + 1) in place of its decode factor."""
    own = lane.own_prefill_s(prompt_tokens, c)
    return lane._ttft_after(own, c) * (c.load + 1) + own * c.waiting
