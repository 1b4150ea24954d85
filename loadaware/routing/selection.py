"""Stage 3, selection and the pick: which candidates the policy scores, and its choice among them.

    a policy with its own selection (`select`: Needs.floored, Needs.turns) over a large pool: its candidates and
        choice (policies/large_pool.py)
    else, a policy with Needs.prunable over a large pool: the holders and the few least loaded
        (routing/pruning.py), with the pool's mean load
    else: every endpoint of the pool
    then the candidates' data the policy reads (routing/candidates.py), and the policy's choice

A pool is large from MIN_POOL endpoints, and only while the fleet's load order is current.
"""

from __future__ import annotations

from typing import Protocol

from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import previewing
from loadaware.load.order import LoadOrder
from loadaware.policies import Candidate, Choice, Policy
from loadaware.policies.large_pool import Selected
from loadaware.routing.candidates import CandidateData
from loadaware.routing.context import DecisionContext
from loadaware.routing.large_pool import FleetPool
from loadaware.routing.pruning import MIN_POOL, pruned_candidates


class Ranking(Protocol):
    def ordered(self) -> LoadOrder: ...


class Selection:
    def __init__(self, policy: Policy, data: CandidateData, registry: EndpointRegistry,
                 ranking: Ranking | None = None, fallbacks: int = 0) -> None:
        self.data = data
        self.registry = registry
        # The fleet's loads in order (load/tracker.py): a large pool scores only part of itself. None: score all.
        self.ranking = ranking
        self.limit = 1 + fallbacks  # the choice and the next-best endpoints named for the proxy's retries
        self.use(policy)

    def use(self, policy: Policy) -> None:
        self.policy = policy
        self._select = getattr(policy, "select", None)  # checked when the policy was registered (policies/)

    def pick(self, ctx: DecisionContext) -> None:
        """ctx.candidates, ctx.choice and ctx.mean_load (None: the candidates are the pool). Raises when the policy
        fails: the pipeline's fallback then chooses the least loaded."""
        selected = self._own(ctx) if self._select is not None else None
        if selected is None:
            candidates, mean = self._scored(ctx)
            self.data.credit_queued(ctx, candidates)
            self.data.fill_working_set(ctx, candidates)
            choice = self.policy.choose(ctx.prompt_tokens, candidates, mean)
            if choice is None:
                raise ValueError("the policy chose nobody among candidates")
            selected = candidates, choice, mean
        ctx.candidates, ctx.choice, ctx.mean_load = selected

    def _own(self, ctx: DecisionContext) -> Selected | None:
        """The policy's own selection over a large pool; None: score the pool as usual."""
        if self.ranking is None or len(ctx.endpoints) < MIN_POOL:
            return None
        assert self._select is not None
        pool = FleetPool(ctx, self.data, self.registry, self.ranking.ordered, self.limit)
        selected: Selected | None = self._select(pool)
        return selected

    def _scored(self, ctx: DecisionContext) -> tuple[tuple[Candidate, ...], float | None]:
        """The candidates to score and, when pruned, the pool's mean load (None: the candidates are the pool). The
        session's sticky endpoint is among them even when pruned."""
        needs = self.policy.needs
        if self.ranking is not None and needs.prunable and len(ctx.endpoints) >= MIN_POOL:
            order = self.ranking.ordered()
            fleet = self.registry.snapshot()
            if len(order) == len(fleet):  # the order holds exactly the fleet (joined and dropped with it)
                whole = ctx.endpoints is fleet
                members = self.registry.members() if whole else frozenset(ctx.endpoints)
                pruned, mean = pruned_candidates(order, ctx.endpoints, members, whole, ctx.matches, ctx.prompt_tokens,
                                                 self.limit, self.registry.position, ctx.excluded, ctx.sticky)
                if self.data.signals is not None and needs.signals:  # a pruned policy that reads them (banded)
                    now = self.data.signals.clock()
                    pruned = tuple(self.data.signalled(c.endpoint, c.matched_tokens, c.load, now) for c in pruned)
                return pruned, mean
        return self.data.plain(ctx, needs.signals or previewing()), None

    def pick_least_loaded(self, ctx: DecisionContext) -> None:
        """The policy failed: every endpoint of the pool, the least loaded chosen."""
        ctx.candidates, ctx.mean_load = self.data.plain(ctx, self.policy.needs.signals or previewing()), None
        ctx.choice = least_loaded(ctx.candidates)


def least_loaded(candidates: tuple[Candidate, ...]) -> Choice:
    """The policy's stand-in when it fails: the lowest load, ties to the lexically smaller endpoint."""
    best = min(range(len(candidates)), key=lambda i: (candidates[i].load, candidates[i].endpoint))
    return Choice(best, tuple(-c.load for c in candidates))
