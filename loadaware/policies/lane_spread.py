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

How it fares against `lane` and the peers is in docs/findings.md and docs/results.md (figures live there, not
here); no constant is tuned per workload: the thresholds are the fleet's capacity (1) and its size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from loadaware.policies.base import Candidate, Choice, Needs, lowest_cost
from loadaware.policies.bounded import MAX_SHARE, bounded_costs
from loadaware.policies.lane import Lane


def spreading(candidates: Sequence[Candidate]) -> bool:
    """Do the fleet's caches have room for another copy of this prompt's prefix, and is it popular enough?"""
    if not candidates:
        return False
    first = candidates[0]
    demand = first.cache_demand
    return demand is not None and demand < 1.0 and first.prefix_routes >= len(candidates)


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
    needs: ClassVar[Needs] = Needs(signals=True, working_set=True, queued_prefixes=True)
    max_share: float = MAX_SHARE  # the pile-up guard (loadaware/policies/bounded.py); 1: off

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate], mean_load: float | None = None
               ) -> Choice | None:
        if not candidates:
            return None
        costs = bounded_costs(self.costs(prompt_tokens, candidates), candidates, self.max_share)
        return lowest_cost(costs, candidates)

    def costs(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
        if not spreading(candidates):
            return super().costs(prompt_tokens, candidates)
        return in_flight_costs(self, prompt_tokens, candidates)


def in_flight_costs(lane: Lane, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
    """`lane`'s costs with the in-flight factor (load + 1) in place of its decode factor."""
    out = []
    for c in candidates:
        own = lane.own_prefill_s(prompt_tokens, c)
        out.append(lane._ttft_after(own, c) * (c.load + 1) + own * c.waiting)
    return out
