"""One request's decision, as a pipeline of stages over one DecisionContext (routing/context.py):

    1. filter       the pool: the fleet in the proxy's subset, serving the request's model, less the engines
                    failing their requests                                           routing/filters.py
    2. producers    the prompt's tokens and prefix matches (for a policy that reads them), the holder of the
                    stored response the request names                                routing/producers.py
       filter       again, after the awaits: an endpoint may have left meanwhile. From here on, no await.
    3. selection    the candidates the policy scores and their data (its own selection over a large pool,
                    the pruned or the whole pool otherwise), and the policy's choice  routing/selection.py
    4. affinity     the session's endpoint instead of the choice while it can take the request
                                                                                     routing/sticky.py
       room         with admission on, an engine with room for the request's band instead of one without
                                                                                     routing/room.py
    5. fallbacks    the next-best endpoints for the proxy's retries; if the policy failed, the least loaded
                    chooses; a stored response's holder alone when it is known (state beats load)
    6. announce     the Decision, told to the request lifecycle (`decided`)

Every stage is time-boxed and optional; when one fails, whatever it raises, the decision falls back to the load
term alone (or, if the policy itself fails, to the least-loaded candidate) and says why in its reasons
(`prefix_error`, `policy_error`, ...): counted in `loadaware_fallbacks_total`, logged once per reason per
interval. `decide` never raises.

The choice is announced with no await between the loads it was scored on and the announcement, so the in-flight
count is taken before any other request can be scored (docs/architecture.md, "Invariants").
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import STATE_RULE, Decision, RequestLifecycle, preview
from loadaware.load.signals import SignalTracker
from loadaware.policies import Candidate, Needs, Policy, ranked
from loadaware.prefix.queued import QueuedPrefixes
from loadaware.prefix.working_set import WorkingSet, sampled_keys
from loadaware.routing.affinity import SessionAffinity
from loadaware.routing.context import ALL_FAILING, DecisionContext, degraded
from loadaware.routing.filters import PoolFilter
from loadaware.routing.producers import Producers, StateLocator
from loadaware.routing.request import InferenceRequest
from loadaware.routing.room import prefer_room
from loadaware.routing.selection import Selection
from loadaware.routing.sticky import Stickiness


class Decider:
    """The stages, wired by routing/builder.py."""

    def __init__(self, policy: Policy, filters: PoolFilter, producers: Producers, selection: Selection,
                 lifecycle: RequestLifecycle, stickiness: Stickiness | None = None) -> None:
        self.filters = filters
        self.producers = producers
        self.selection = selection
        self.data = selection.data
        self.lifecycle = lifecycle
        self.stickiness = stickiness

    @property
    def policy(self) -> Policy:
        return self.selection.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        """Another policy from the next decision on, for this decider and those sharing its selection (an
        experiment's arm; the parts its Needs would build are the ones built for the first)."""
        self.selection.use(policy)

    def with_policy(self, policy: Policy) -> Decider:
        """A decider sharing every part of this one but the policy (Explain previews on a copy of the policy, so
        round robin's turn is not used up)."""
        selection = copy.copy(self.selection)
        selection.use(policy)
        return Decider(policy, self.filters, self.producers, selection, self.lifecycle, self.stickiness)

    @property
    def needs(self) -> Needs:
        """What the policy reads (policies/base.py): the stages fill exactly that."""
        return self.policy.needs

    async def decide(self, request: InferenceRequest | None, request_id: str = "", count: bool = True,
                     parse_s: float | None = None, subset: frozenset[str] | None = None, session: str = "",
                     room: Callable[[str], bool] | None = None) -> Decision:
        """`subset`: the proxy's hint; only endpoints in it are candidates (None: the whole fleet). `session`:
        the request's session key (--session-header; "" = none): with affinity on, the session's endpoint is
        preferred while it can take the request (routing/affinity.py). `room`: admission's test of an engine's room
        for the request's band (routing/room.py; None: admission off). Without `count` (Explain) the decision is
        a preview: nothing hears of it and no stage changes any state. Never raises (but for cancellation): what
        no stage's own guard caught ends in a load-blind decision."""
        ctx = DecisionContext(request, request_id, count, subset, session, room=room)
        if parse_s is not None:
            ctx.stages["parse"] = parse_s
        try:
            if count:
                return await self._decide(ctx)
            with preview():
                return await self._decide(ctx)
        except Exception as exc:  # noqa: BLE001 - a decision for every request, whatever failed
            reasons = ["decide_error"]
            degraded(reasons, "decide_error", exc)
            return self._last_resort(request_id, reasons, count)

    async def _decide(self, ctx: DecisionContext) -> Decision:
        self.filters.narrow(ctx)  # who to ask about the prefix (the excluded too: cheaper)
        if not ctx.endpoints:
            return self._empty(ctx)
        await self.producers.produce(ctx, self.needs.prefix)
        t = time.perf_counter()
        self.filters.narrow(ctx)
        if not ctx.endpoints:
            return self._empty(ctx)
        if self.data.working_set is not None and ctx.tokens and ctx.request is not None:
            ctx.sampled = sampled_keys(ctx.tokens, ctx.request.cache_salt)
        if self.stickiness is not None:
            self.stickiness.find(ctx)
        self._choose(ctx)
        if ctx.holder is not None and ctx.holder in self.filters.registry.snapshot():
            ctx.order = (ctx.holder,)  # state beats load: the holder alone (elsewhere finds no such response)
        if self.stickiness is not None:
            self.stickiness.bind(ctx)
        self.data.observe_prompt(ctx)
        ctx.timed("score", t)
        # Failing engines left out is news, not a lost helper: the decision still used every signal.
        outcome = "fallback_load_only" if ctx.reasons and ctx.reasons != [ALL_FAILING] else "routed"
        return self._finish(ctx, ctx.order, outcome)

    def _choose(self, ctx: DecisionContext) -> None:
        """Selection, affinity and the ranked fallbacks; a failing policy: the least-loaded candidate instead."""
        try:
            self.selection.pick(ctx)
            if self.stickiness is not None:
                self.stickiness.stick(ctx, ctx.pool_size)
            prefer_room(ctx)
        except Exception as exc:  # noqa: BLE001 - a failing policy: the least-loaded candidate instead
            ctx.degrade("policy_error", exc)
            self.selection.pick_least_loaded(ctx)
            if self.stickiness is not None:
                self.stickiness.stick(ctx, len(ctx.candidates))
            prefer_room(ctx)
        assert ctx.choice is not None
        ctx.order = tuple(ctx.candidates[i].endpoint for i in ranked(ctx.choice, ctx.candidates, self.selection.limit))

    def _last_resort(self, request_id: str, reasons: list[str], count: bool) -> Decision:
        """The first endpoint of the fleet, named when something unforeseen failed mid-decision."""
        ctx = DecisionContext(None, request_id, count, reasons=reasons)
        try:
            fleet = self.filters.registry.snapshot()
        except Exception:  # noqa: BLE001 - nobody named: the proxy's own fallback picks
            fleet = ()
        order = fleet[:self.selection.limit]
        return self._announce(ctx, Decision(request_id, order[0] if order else None,
                                            "fallback_load_only" if order else "no_endpoints", tuple(reasons), 0,
                                            (), (), {}, time.perf_counter() - ctx.started, ranked=order,
                                            policy=self.policy.name))

    def _empty(self, ctx: DecisionContext) -> Decision:
        """Nobody to route to: the fleet is empty, nothing in it is in the proxy's subset, or no engine of the
        whole fleet serves the request's model (the gateway answers 404 itself)."""
        if self.filters.model_unserved(ctx.model):
            outcome = "unknown_model"
        else:
            outcome = "no_eligible_endpoints" if ctx.subset is not None and self.filters.registry.snapshot() \
                else "no_endpoints"
        return self._announce(ctx, Decision(ctx.request_id, None, outcome, (outcome,), len(ctx.tokens), (), (),
                                            ctx.stages, time.perf_counter() - ctx.started, model=ctx.model,
                                            policy=self.policy.name))

    def _finish(self, ctx: DecisionContext, order: tuple[str, ...], outcome: str) -> Decision:
        choice = ctx.choice
        assert choice is not None
        state_placed = ctx.holder is not None and order == (ctx.holder,)
        return self._announce(ctx, Decision(
            ctx.request_id, order[0], outcome, tuple(ctx.reasons), ctx.prompt_tokens, ctx.candidates, choice.scores,
            ctx.stages, time.perf_counter() - ctx.started, tokens=ctx.tokens or None, ranked=order, model=ctx.model,
            pool_size=ctx.pool_size or len(ctx.candidates), mean_load=ctx.mean_load, policy=self.policy.name,
            rule=STATE_RULE if state_placed else choice.rule, session=ctx.session, affinity=ctx.affinity,
            state=ctx.state))

    def _announce(self, ctx: DecisionContext, decision: Decision) -> Decision:
        if ctx.count:  # Explain decides without counting: nothing hears about it
            self.lifecycle.decided(decision)
        return decision

    # ---- what the API, the extproc and the pages read of the core ----
    @property
    def registry(self) -> EndpointRegistry:
        return self.filters.registry

    @property
    def state(self) -> StateLocator | None:
        return self.producers.state

    @property
    def working_set(self) -> WorkingSet | None:
        return self.data.working_set

    @working_set.setter
    def working_set(self, value: WorkingSet | None) -> None:  # a probe measuring its cost turns it off and on
        self.data.working_set = value

    @property
    def queued(self) -> QueuedPrefixes | None:
        return self.data.queued

    @queued.setter
    def queued(self, value: QueuedPrefixes | None) -> None:  # a probe measuring its cost turns it off and on
        self.data.queued = value

    @property
    def signals(self) -> SignalTracker | None:
        return self.data.signals

    @signals.setter
    def signals(self, value: SignalTracker | None) -> None:  # a probe measuring its cost turns it off and on
        self.data.signals = value

    @property
    def affinity(self) -> SessionAffinity | None:
        return self.stickiness.affinity if self.stickiness is not None else None

    def endpoints(self, subset: frozenset[str] | None, model: str | None = None,
                  reasons: list[str] | None = None) -> tuple[str, ...]:
        return self.filters.endpoints(subset, model, reasons)

    def candidates(self, subset: frozenset[str] | None, model: str | None, reasons: list[str]) -> tuple[str, ...]:
        return self.filters.candidates(subset, model, reasons)

    async def prompt_tokens(self, request: InferenceRequest) -> list[int]:
        return await self.producers.prompt_tokens(request)

    def signalled(self, ep: str, matched: int, load: float, now: float | None = None) -> Candidate:
        return self.data.signalled(ep, matched, load, now)
