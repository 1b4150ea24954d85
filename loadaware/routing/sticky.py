"""Stage 4, after the pick: session affinity (routing/affinity.py has the rule and the bindings).

Before selection it finds the session's endpoint (ctx.sticky; a large pool keeps it among the candidates); after
the pick, the sticky endpoint replaces the policy's choice when it is a candidate and not saturated (the
policy's scores stay, so its ranking supplies the fallbacks); once the decision is made, a counted decision
binds the session to the endpoint it named first. Affinity is advice: when it fails, the policy's choice
stands and the decision says so (affinity_error).
"""

from __future__ import annotations

from collections.abc import Callable

from loadaware.policies import Candidate, Choice
from loadaware.policies.bounded import pool_cap
from loadaware.routing.affinity import SessionAffinity, saturated
from loadaware.routing.context import DecisionContext


class Stickiness:
    def __init__(self, affinity: SessionAffinity, waiting: Callable[[Candidate], float]) -> None:
        self.affinity = affinity
        self.waiting = waiting  # a candidate's scraped waiting queue (routing/candidates.py)

    def find(self, ctx: DecisionContext) -> None:
        """The endpoint the session is bound to (None: no binding, or the store failed)."""
        if not ctx.session:
            return
        affinity = self.affinity
        try:
            ctx.sticky = affinity.sticky(ctx.session, affinity.clock())
        except Exception as exc:  # noqa: BLE001 - affinity is advice: the normal decision instead
            ctx.degrade("affinity_error", exc)

    def stick(self, ctx: DecisionContext, pool_size: int) -> None:
        """The sticky endpoint as the choice when it is a candidate and not saturated. `pool_size`: the pool the
        pile-up guard's cap is taken over (a pruned decision scores part of it)."""
        choice, candidates, sticky = ctx.choice, ctx.candidates, ctx.sticky
        if sticky is None or choice is None:
            return
        try:
            index = next((i for i, c in enumerate(candidates) if c.endpoint == sticky), None)
            if index is None or index == choice.index:
                return
            mean = ctx.mean_load
            total = sum(c.load for c in candidates) if mean is None else mean * pool_size
            if saturated(candidates[index], candidates, pool_cap(total, pool_size), self.waiting):
                return
            ctx.choice = Choice(index, choice.scores, choice.rule)
        except Exception as exc:  # noqa: BLE001 - affinity is advice: the policy's choice stands
            ctx.degrade("affinity_error", exc)

    def bind(self, ctx: DecisionContext) -> None:
        """What affinity did (kept, moved, new); a counted decision binds the session to its choice. A preview
        reads, never binds."""
        if not ctx.session:
            return
        affinity, chosen = self.affinity, ctx.order[0]
        try:
            if ctx.count:
                affinity.remember(ctx.session, chosen, affinity.clock())
        except Exception as exc:  # noqa: BLE001 - the next request of the session decides afresh
            ctx.degrade("affinity_error", exc)
        ctx.affinity = "new" if ctx.sticky is None else "kept" if chosen == ctx.sticky else "moved"
