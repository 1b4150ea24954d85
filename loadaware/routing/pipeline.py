"""One request's decision: tokenize -> prefix matches -> loads -> policy -> choice.

Every helper is time-boxed and optional; when one fails, whatever it raises, the decision falls back to
the load term alone (or, if the policy itself fails, to the least-loaded candidate) and says why in its
reasons (`prefix_error`, `policy_error`, ...): counted in `loadaware_fallbacks_total`, logged once per reason
per interval. `decide` never raises.

The choice is announced on the request lifecycle (`decided`) with no await between the loads it was scored on
and the announcement, so the in-flight count is taken before any other request
can be scored (docs/architecture.md, "Invariants").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from loadaware.fleet.members import member_set
from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import Decision, RequestLifecycle, preview, previewing
from loadaware.load.order import LoadOrder
from loadaware.load.signals import SignalTracker
from loadaware.policies import Candidate, Choice, Needs, Policy, ranked
from loadaware.policies.base import lowest_cost
from loadaware.policies.bounded import past_cap, pool_cap
from loadaware.policies.ttft_model import Prices, TtftPrior
from loadaware.prefix.queued import QueuedPrefixes
from loadaware.prefix.source import PartlyUnavailable, PrefixSource, PrefixUnavailable, PromptTokens
from loadaware.prefix.working_set import BLOCK_TOKENS, WorkingSet, sampled_keys, working_view
from loadaware.routing.affinity import SessionAffinity, saturated
from loadaware.routing.pruning import MIN_POOL, floored_candidates, pool_load, pruned_candidates, round_robin_candidates
from loadaware.routing.request import InferenceRequest
from loadaware.telemetry.faults import RateLimitedLog, describe
from loadaware.tokenize.tokenizer import TokenHead, TokenizerBusy

log = logging.getLogger(__name__)
faults = RateLimitedLog(log)  # one line per failing helper per interval, not a traceback per request

ALL_FAILING = "all_endpoints_failing"
class Loads(Protocol):
    def loads(self, endpoints: tuple[str, ...]) -> list[float]: ...


class Ranking(Protocol):
    def ordered(self) -> LoadOrder: ...


class Eligibility(Protocol):
    def eligible(self, endpoints: tuple[str, ...]) -> tuple[str, ...]: ...

    def not_admitted(self) -> set[str]: ...

    def capped(self, out: frozenset[str], candidates: int) -> frozenset[str]: ...


class ModelPools(Protocol):
    def pool(self, model: str, endpoints: tuple[str, ...]) -> tuple[str, ...] | None: ...


class PromptEncoder(Protocol):
    async def encode_prompt(self, prompt: str) -> list[int]: ...

    async def encode_chat(self, messages: list[dict[str, object]], options: dict[str, object] | None = None
                          ) -> list[int]: ...


class StateLocator(Protocol):
    async def locate(self, response_id: str, fleet: tuple[str, ...]) -> tuple[str | None, str]: ...

    def learn(self, response_id: str, endpoint: str) -> None: ...


class TakesTurns(Protocol):
    """A policy with Needs.turns: the endpoint whose turn it is, out of n in lexical order (roundrobin)."""

    def turn(self, n: int) -> int: ...


class Floored(Protocol):
    """A policy with Needs.floored (lane-spread): its cost per candidate (lowest wins, ties as lowest_cost
    breaks them) and a floor under the cost of any endpoint that holds nothing of the prompt
    (policies/lane_spread.py)."""

    prior: TtftPrior
    max_share: float

    def cost_in(self, prompt_tokens: int, c: Candidate, spread: bool) -> float: ...

    def floor(self, prompt_tokens: int, load: float, prices: Prices, spread: bool) -> float: ...

    def bounds(self, prompt_tokens: int, load: float, spread: bool, endpoints: Sequence[str],
               prices_of: Callable[[str], Prices | None], prior: Prices, kth: float, extra: float = 0.0
               ) -> list[tuple[float, str]]: ...


class Decider:
    def __init__(self, policy: Policy, registry: EndpointRegistry, loads: Loads, lifecycle: RequestLifecycle,
                 tokenizer: PromptEncoder | None = None, prefix_source: PrefixSource | None = None,
                 fallbacks: int = 0, health: Eligibility | None = None, models: ModelPools | None = None,
                 ranking: Ranking | None = None, signals: SignalTracker | None = None,
                 working_set: WorkingSet | None = None, affinity: SessionAffinity | None = None,
                 state: StateLocator | None = None) -> None:
        self.policy = policy
        # Where stored responses live (fleet/state_holders.py): a request naming one goes to its holder, whatever
        # the policy would say (state beats load). None: no state routing.
        self.state = state
        needs = policy.needs  # what it reads: the pipeline fills exactly that (policies/base.py)
        # The fleet's prefix working set, for a policy that reads it (policies/lane_spread.py): each routed
        # prompt's sampled keys feed it, the engines' scraped KV capacity sizes it (prefix/working_set.py).
        if working_set is None and needs.working_set:
            working_set = WorkingSet()
        self.working_set = working_set
        # Prompts routed to engines that queue, credited to later requests for the same prefix there
        # (prefix/queued.py), for a policy that reads them; it hears of each request's life to hold and release.
        self.queued = QueuedPrefixes() if needs.queued_prefixes else None
        if self.queued is not None:
            lifecycle.subscribe(self.queued)
        self._fleet_capacity = getattr(loads, "kv_capacity_tokens", None)
        self._capacity_seen = 0.0
        self.signals = signals  # per-endpoint token signals (load/signals.py); None: candidates carry none
        self._fresh_stats = getattr(loads, "fresh_stats", None)  # bound once: the candidates are the hot path
        self._correction = getattr(loads, "snapshot_correction", None)
        self._queueing: set[str] | None = getattr(loads, "queueing", None)  # fresh scrapes with a queue
        self.health = health  # engines failing their requests are left out (fleet/health.py)
        self.models = models  # which engines serve which model (None: model awareness off)
        self.fallbacks = fallbacks  # next-best endpoints named after the choice, for the proxy's retries
        self.registry = registry
        self.loads = loads
        self.lifecycle = lifecycle
        self.tokenizer = tokenizer
        self.prefix_source = prefix_source
        # The fleet's loads in order (load/tracker.py): a large pool scores only its prefix holders and its few
        # least-loaded endpoints (routing/pruning.py says why the choice is the same). None: score them all.
        self.ranking = ranking
        # Session affinity (--session-header; None: off): a session's requests stick to its endpoint while it
        # can take them (routing/affinity.py). It hears who served, so a session follows the proxy's retries.
        self.affinity = affinity
        if affinity is not None:
            lifecycle.subscribe(affinity)

    @property
    def needs(self) -> Needs:
        """What the policy reads (policies/base.py): the pipeline fills exactly that."""
        return self.policy.needs

    async def prompt_tokens(self, request: InferenceRequest) -> list[int]:
        """Token ids as the engine will see them; raises on tokenizer failure or timeout."""
        if request.messages is not None:
            if self.tokenizer is None:
                raise LookupError("no_tokenizer")
            return await self.tokenizer.encode_chat(request.messages, request.chat_options)
        if isinstance(request.prompt, list):
            return request.prompt
        if self.tokenizer is None:
            raise LookupError("no_tokenizer")
        return await self.tokenizer.encode_prompt(request.prompt or "")

    def endpoints(self, subset: frozenset[str] | None, model: str | None = None,
                  reasons: list[str] | None = None) -> tuple[str, ...]:
        """The fleet, or the part of it in the proxy's subset hint; then only the engines serving `model`
        when their models are known. A model's engines are its own fleet: the policy compares loads (and
        takes the mean) over what this returns (docs/architecture.md, "Model pools")."""
        fleet = self.registry.snapshot()
        eligible = fleet if subset is None else tuple(ep for ep in fleet if ep in subset)
        if model is None or self.models is None:
            return eligible
        try:
            pool = self.models.pool(model, eligible)
        except Exception as exc:  # noqa: BLE001 - a failing model map filters nothing (fail open)
            _degraded(reasons, "models_error", exc)
            return eligible
        return eligible if pool is None else pool

    def candidates(self, subset: frozenset[str] | None, model: str | None, reasons: list[str]) -> tuple[str, ...]:
        """The endpoints a decision may choose: the model's pool in the fleet (or subset) less the engines
        failing their requests. If that leaves nobody, the whole pool (fail open: the proxy's retries and
        outlier detection still act), and the decision says so."""
        return self._eligible(self.endpoints(subset, model, reasons), reasons)

    def _eligible(self, endpoints: tuple[str, ...], reasons: list[str]) -> tuple[str, ...]:
        """`endpoints` less the engines failing their requests (all of them when that leaves nobody)."""
        if self.health is None or not endpoints:
            return endpoints
        try:
            eligible = self.health.eligible(endpoints)
        except Exception as exc:  # noqa: BLE001 - a failing health tracker leaves nobody out (fail open)
            _degraded(reasons, "health_error", exc)
            return endpoints
        if eligible:
            return eligible
        if ALL_FAILING not in reasons:
            reasons.append(ALL_FAILING)
        return endpoints

    def _pool(self, subset: frozenset[str] | None, model: str | None, reasons: list[str]
              ) -> tuple[tuple[str, ...], frozenset[str]]:
        """What `candidates` says, as (endpoints, excluded): a large pool is not filtered one endpoint at a
        time; the few engines failing their requests come back as a set to leave out (empty for a small pool,
        which is filtered, and when failing open)."""
        endpoints = self.endpoints(subset, model, reasons)
        if self.health is None or len(endpoints) < MIN_POOL:
            return self._eligible(endpoints, reasons), frozenset()
        try:
            out = self.health.not_admitted()
            if not out:
                return endpoints, frozenset()
            members = member_set(endpoints)
            excluded = self.health.capped(frozenset(ep for ep in out if ep in members), len(endpoints))
        except Exception as exc:  # noqa: BLE001 - a failing health tracker leaves nobody out (fail open)
            _degraded(reasons, "health_error", exc)
            return endpoints, frozenset()
        if len(excluded) < len(endpoints):
            return endpoints, excluded
        if ALL_FAILING not in reasons:
            reasons.append(ALL_FAILING)
        return endpoints, frozenset()

    async def prefix_matches(self, tokens: list[int], endpoints: tuple[str, ...], reasons: list[str],
                             salt: str | None = None) -> dict[str, int]:
        if self.prefix_source is None:
            reasons.append("no_prefix_source")
            return {}
        try:
            return await self.prefix_source.matches(tokens, endpoints, salt)
        except PrefixUnavailable as exc:
            reasons.append(exc.reason)
            # A combined source that lost one member still has the others' answer (prefix/combined.py).
            return exc.answer if isinstance(exc, PartlyUnavailable) else {}
        except Exception as exc:  # noqa: BLE001 - a broken source degrades to the load term, never fails
            _degraded(reasons, "prefix_error", exc)
            return {}

    async def decide(self, request: InferenceRequest | None, request_id: str = "", count: bool = True,
                     parse_s: float | None = None, subset: frozenset[str] | None = None, session: str = ""
                     ) -> Decision:
        """`subset`: the proxy's hint; only endpoints in it are candidates (None: the whole fleet). `session`:
        the request's session key (--session-header; "" = none): with affinity on, the session's endpoint is
        preferred while it can take the request (routing/affinity.py). Without
        `count` (Explain) the decision is a preview: nothing hears of it and no helper changes any state.
        Never raises (but for cancellation): what no helper's own guard caught ends in a load-blind decision."""
        try:
            if count:
                return await self._decide(request, request_id, True, parse_s, subset, session)
            with preview():
                return await self._decide(request, request_id, False, parse_s, subset, session)
        except Exception as exc:  # noqa: BLE001 - a decision for every request, whatever failed
            reasons = ["decide_error"]
            _degraded(reasons, "decide_error", exc)
            return self._last_resort(request_id, reasons, count)

    async def _decide(self, request: InferenceRequest | None, request_id: str, count: bool,
                      parse_s: float | None, subset: frozenset[str] | None, session: str = "") -> Decision:
        started = time.perf_counter()
        stages: dict[str, float] = {} if parse_s is None else {"parse": parse_s}
        reasons: list[str] = []
        tokens: list[int] = []
        prompt_total = 0  # the prompt's estimated length when only its head was tokenized
        matches: dict[str, int] = {}
        model = request.model if request is not None else None
        endpoints, _ = self._pool(subset, model, reasons)  # who to ask about the prefix (the excluded too: cheaper)
        if not endpoints:
            return self._empty(request_id, subset, 0, stages, started, count, model)
        if request is not None and request.state_id is not None and not request.has_prompt:
            pass  # a stored response's own path: placed by its state, there is no prompt to miss
        elif request is None or not request.has_prompt:
            reasons.append(request.unscored or "no_prompt" if request is not None else "no_prompt")
        elif self.needs.prefix:
            t = time.perf_counter()
            try:
                tokens = await self.prompt_tokens(request)
            except LookupError as exc:  # no tokenizer, or no chat template that renders (told once at start)
                reasons.append(str(exc.args[0]) if exc.args else "no_tokenizer")
            except TokenizerBusy:  # the threads' backlog would not start it in time: not waited for
                reasons.append("tokenizer_busy")
            except TimeoutError:
                reasons.append("tokenizer_timeout")
            except Exception as exc:  # noqa: BLE001 - any tokenizer failure degrades, never fails, the request
                _degraded(reasons, "tokenizer_error", exc)
            stages["tokenize"] = time.perf_counter() - t
            if isinstance(tokens, TokenHead):  # a long prompt: its head's ids, its whole length estimated
                prompt_total = tokens.total
            if tokens:
                # The salt keys the engine's prefix cache as much as the tokens do; it travels with them (the
                # approximate index records the decision's tokens under it), as do the block-key chains the
                # decision's lookups compute once and share, for as long as the request lives.
                tokens = PromptTokens(tokens, request.cache_salt or None)
                t = time.perf_counter()
                matches = await self.prefix_matches(tokens, endpoints, reasons, request.cache_salt)
                stages["lookup"] = time.perf_counter() - t
        holder, state = (None, "") if request is None or request.state_id is None else \
            await self._holder(request.state_id, stages, reasons)
        # Fresh snapshot after the awaits: an endpoint may have left meanwhile. From here on, no await.
        t = time.perf_counter()
        endpoints, excluded = self._pool(subset, model, reasons)
        if not endpoints:
            return self._empty(request_id, subset, len(tokens), stages, started, count, model)
        n_tokens = max(len(tokens), prompt_total)
        mean: float | None = None
        ws = self.working_set
        sampled = sampled_keys(tokens, request.cache_salt) if ws is not None and tokens and request else None
        # The session's endpoint, if it has one (affinity off: no session key, one falsy check).
        sticky = self._sticky(session, reasons) if session else None
        pool_size = len(endpoints) - len(excluded)
        try:
            # Round robin's shortcut scores only the turn and the least loaded: a sticky endpoint needs the pool.
            turn = self._round_robin_turn(endpoints, excluded) if sticky is None else None
            floored = None
            if turn is None and self.needs.floored:
                floored = self._floored(endpoints, excluded, matches, n_tokens, tokens, sampled, count, reasons,
                                        sticky)
            if turn is not None:
                candidates, choice = turn
            elif floored is not None:
                candidates, choice, mean = floored
            else:
                candidates, mean = self._scored(endpoints, excluded, matches, n_tokens, reasons, sticky)
                if self.queued is not None and tokens:
                    self._credit_queued(candidates, tokens, count, reasons)
                if sampled is not None:
                    self._fill_working_set(candidates, sampled, reasons)
                picked = self.policy.choose(n_tokens, candidates, mean)
                if picked is None:
                    raise ValueError("the policy chose nobody among candidates")
                choice = picked
            if sticky is not None:
                choice = self._stick(choice, candidates, sticky, mean, pool_size, reasons)
            order = tuple(candidates[i].endpoint for i in ranked(choice, candidates, 1 + self.fallbacks))
        except Exception as exc:  # noqa: BLE001 - a failing policy: the least-loaded candidate instead
            _degraded(reasons, "policy_error", exc)
            candidates, mean = self._plain(endpoints, excluded, matches, n_tokens, reasons), None
            choice = least_loaded(candidates)
            if sticky is not None:
                choice = self._stick(choice, candidates, sticky, None, len(candidates), reasons)
            order = tuple(candidates[i].endpoint for i in ranked(choice, candidates, 1 + self.fallbacks))
        if holder is not None and holder in self.registry.snapshot():
            # State beats load: the holder alone (a retry elsewhere would only find no such response).
            order = (holder,)
        affinity = self._bind(session, sticky, order[0], count, reasons) if session else ""
        if sampled and count and ws is not None:
            try:
                ws.observe(sampled, n_tokens // BLOCK_TOKENS)
            except Exception as exc:  # noqa: BLE001 - the estimate misses one request, the decision stands
                _degraded(reasons, "working_set_error", exc)
        stages["score"] = time.perf_counter() - t
        # Failing engines left out is news, not a lost helper: the decision still used every signal.
        outcome = "fallback_load_only" if reasons and reasons != [ALL_FAILING] else "routed"
        return self._finish(request_id, order, outcome, reasons, n_tokens, candidates, choice.scores, stages,
                            started, count, tokens, model, pool_size, mean, session, affinity,
                            "state" if holder is not None and order == (holder,) else choice.rule, state)

    async def _holder(self, response_id: str, stages: dict[str, float], reasons: list[str]) -> tuple[str | None, str]:
        """The engine holding a stored response, and how it was found (fleet/state_holders.py)."""
        if self.state is None:
            return None, "no_locator"
        t = time.perf_counter()
        try:
            return await self.state.locate(response_id, self.registry.snapshot())
        except Exception as exc:  # noqa: BLE001 - a failing locator: routed as any request, the engine answers
            _degraded(reasons, "state_error", exc)
            return None, "error"
        finally:
            stages["state"] = time.perf_counter() - t

    def _last_resort(self, request_id: str, reasons: list[str], count: bool) -> Decision:
        """The first endpoint of the fleet, named when something unforeseen failed mid-decision."""
        started = time.perf_counter()
        try:
            fleet = self.registry.snapshot()
        except Exception:  # noqa: BLE001 - nobody named: the proxy's own fallback picks
            fleet = ()
        order = fleet[:1 + self.fallbacks]
        return self._finish(request_id, order, "fallback_load_only" if order else "no_endpoints", reasons, 0,
                            (), (), {}, started, count)

    def _round_robin_turn(self, endpoints: tuple[str, ...], excluded: frozenset[str]
                          ) -> tuple[tuple[Candidate, ...], Choice] | None:
        """Round robin over a large, whole fleet: the endpoint at the turn's place in the lexical order, and
        the least-loaded others as its fallbacks (routing/pruning.py). None: score the pool as usual."""
        policy = self.policy
        if (self.ranking is None or not self.needs.turns or excluded or len(endpoints) < MIN_POOL
                or endpoints is not self.registry.snapshot()):
            return None
        order = self.ranking.ordered()
        if len(order) != len(endpoints):
            return None
        lexical = self.registry.lexical()
        pick = lexical[cast(TakesTurns, policy).turn(len(lexical))]
        candidates, index, scores = round_robin_candidates(order, pick, 1 + self.fallbacks, self.registry.position)
        return candidates, Choice(index, scores)

    def _scored(self, endpoints: tuple[str, ...], excluded: frozenset[str], matches: dict[str, int], n_tokens: int,
                reasons: list[str], keep: str | None = None) -> tuple[tuple[Candidate, ...], float | None]:
        """The candidates to score (the pool is `endpoints` less `excluded`) and, when pruned, the pool's mean
        load (None: the candidates are the pool). `keep`: an endpoint of the pool that must be among them even
        when pruned (a session's sticky endpoint)."""
        if self.ranking is not None and self.needs.prunable and len(endpoints) >= MIN_POOL:
            order = self.ranking.ordered()
            fleet = self.registry.snapshot()
            if len(order) == len(fleet):  # the order holds exactly the fleet (joined and dropped with it)
                whole = endpoints is fleet
                members = self.registry.members() if whole else frozenset(endpoints)
                pruned, mean = pruned_candidates(order, endpoints, members, whole, matches, n_tokens,
                                                 1 + self.fallbacks, self.registry.position, excluded, keep)
                if self.signals is not None and self.needs.signals:  # a pruned policy that reads them (banded)
                    now = self.signals.clock()
                    pruned = tuple(self.signalled(c.endpoint, c.matched_tokens, c.load, now) for c in pruned)
                return pruned, mean
        return self._plain(endpoints, excluded, matches, n_tokens, reasons), None

    def _floored(self, endpoints: tuple[str, ...], excluded: frozenset[str], matches: dict[str, int], n_tokens: int,
                 tokens: list[int], sampled: list[int] | None, count: bool, reasons: list[str], keep: str | None
                 ) -> tuple[tuple[Candidate, ...], Choice, float] | None:
        """A floored policy's decision over a large pool (routing/pruning.py, floored_candidates): its holders,
        the endpoints it must score whatever their load (prices learned since last read, engines a queued
        prompt may credit, the session's endpoint), then the rest in load order until none can rank. Returns
        (candidates in pool order, the choice, the pool's mean load); None: score the pool as usual."""
        signals = self.signals
        if self.ranking is None or signals is None or len(endpoints) < MIN_POOL:
            return None
        order = self.ranking.ordered()
        fleet = self.registry.snapshot()
        if len(order) != len(fleet):  # the order holds exactly the fleet (joined and dropped with it)
            return None
        policy = cast(Floored, self.policy)
        whole = endpoints is fleet
        members = self.registry.members() if whole else frozenset(endpoints)

        def in_pool(ep: str) -> bool:
            return ep in members and ep not in excluded

        must = {ep: min(n, n_tokens) for ep, n in matches.items() if n > 0 and in_pool(ep)}
        always = (*signals.unread(), *(self.queued.engines() if self.queued is not None else ()),
                  *((keep,) if keep is not None else ()))
        for ep in always:
            if in_pool(ep):
                must.setdefault(ep, 0)
        now = signals.clock()
        load_of = order.load
        size = len(endpoints) - len(excluded)
        total = pool_load(order, endpoints, whole, excluded)
        if self._pool_queues(members, excluded):
            # The policy chooses as loadaware (LaneSpread.choose): its holders and the least loaded of the rest
            # are all that can rank (routing/pruning.py), each of them queueing.
            least = order.least(1 + self.fallbacks, lambda ep: ep in must or not in_pool(ep))
            candidates = tuple(self.signalled(ep, must.get(ep, 0), load_of(ep) or 0.0, now)
                               for ep in sorted((*must, *least), key=self.registry.position))
            if self.queued is not None and tokens:
                self._credit_queued(candidates, tokens, count, reasons)
            if sampled is not None:
                self._fill_working_set(candidates, sampled, reasons)
            choice = self.policy.choose(n_tokens, candidates, total / size)
            return (candidates, choice, total / size) if choice is not None else None
        scored = [self.signalled(ep, matched, load_of(ep) or 0.0, now) for ep, matched in must.items()]
        signals.read(scored)
        if self.queued is not None and tokens:
            self._credit_queued(tuple(scored), tokens, count, reasons)
        demand, routes = self._working_view(scored, sampled, reasons)
        spread = demand is not None and demand < 1.0 and routes >= size
        cap = pool_cap(total, size, policy.max_share)
        prior = policy.prior.prices()
        lowest = signals.price_floor(prior)
        read = signals.read_prices

        def cost(c: Candidate) -> float:
            return policy.cost_in(n_tokens, c, spread) + past_cap(c.load, cap)

        def floor(load: float) -> float:  # any endpoint's, at the lowest prices
            return policy.floor(n_tokens, load, lowest, spread) + past_cap(load, cap)

        def bound(load: float) -> Callable[[Sequence[str], float], list[tuple[float, str]]]:
            """Of endpoints at this load, (their floor at their own prices, the endpoint) where it is at most
            `kth`."""
            extra = past_cap(load, cap)
            return lambda eps, kth: policy.bounds(n_tokens, load, spread, eps, read, prior, kth, extra)

        scored_costs = [cost(c) for c in scored]
        rest, rest_costs = floored_candidates(
            order, must, members, excluded, scored, scored_costs, 1 + self.fallbacks,
            lambda ep, load: self.signalled(ep, 0, load, now), cost, floor, bound)
        # The policy's choice over the pool, from the costs it priced (the guard's included): in pool order.
        position = self.registry.position
        pairs = sorted(zip((*scored, *rest), (*scored_costs, *rest_costs)),
                       key=lambda pair: position(pair[0].endpoint))
        candidates = tuple(c for c, _ in pairs)
        if sampled is not None:
            for c in candidates:
                c.cache_demand, c.prefix_routes = demand, routes
        return candidates, lowest_cost([x for _, x in pairs], candidates), total / size

    def _pool_queues(self, members: frozenset[str], excluded: frozenset[str]) -> bool:
        """Does every endpoint of the pool (`members` less `excluded`) queue: a fresh scrape with waiting > 0, as
        its candidate would show (the load tracker's set, current once `ordered()` expired the stale)? A pool
        with fewer queueing endpoints than members answers at once."""
        queueing = self._queueing
        if queueing is None or len(queueing) < len(members) - len(excluded):
            return False
        return any(ep not in excluded for ep in members) and \
            all(ep in queueing for ep in members if ep not in excluded)

    def _sticky(self, session: str, reasons: list[str]) -> str | None:
        """The endpoint the session is bound to (None: affinity off, no binding, or the store failed)."""
        affinity = self.affinity
        if affinity is None:
            return None
        try:
            return affinity.sticky(session, affinity.clock())
        except Exception as exc:  # noqa: BLE001 - affinity is advice: the normal decision instead
            _degraded(reasons, "affinity_error", exc)
            return None

    def _stick(self, choice: Choice, candidates: tuple[Candidate, ...], sticky: str, mean: float | None,
               pool_size: int, reasons: list[str]) -> Choice:
        """The sticky endpoint as the choice when it is a candidate and not saturated (routing/affinity.py);
        the policy's scores stay, so its ranking supplies the fallbacks. Else the policy's choice."""
        try:
            index = next((i for i, c in enumerate(candidates) if c.endpoint == sticky), None)
            if index is None or index == choice.index:
                return choice
            # A pruned decision scores part of its pool: the guard's cap is the pool's, from its mean load.
            total = sum(c.load for c in candidates) if mean is None else mean * pool_size
            if saturated(candidates[index], candidates, pool_cap(total, pool_size), self._waiting):
                return choice
            return Choice(index, choice.scores, choice.rule)
        except Exception as exc:  # noqa: BLE001 - affinity is advice: the policy's choice stands
            _degraded(reasons, "affinity_error", exc)
            return choice

    def _waiting(self, c: Candidate) -> float:
        """The candidate's scraped waiting queue: carried by candidates of a policy with signals, else read from
        the load tracker's fresh stats (0 without a fresh scrape)."""
        if c.waiting > 0 or self._fresh_stats is None:
            return c.waiting
        stats = self._fresh_stats(c.endpoint)
        return stats.waiting if stats is not None else 0.0

    def _bind(self, session: str, sticky: str | None, chosen: str, count: bool, reasons: list[str]) -> str:
        """What affinity did (kept, moved, new; "" when off); a counted decision binds the session to its
        choice. A preview reads, never binds."""
        affinity = self.affinity
        if affinity is None:
            return ""
        try:
            if count:
                affinity.remember(session, chosen, affinity.clock())
        except Exception as exc:  # noqa: BLE001 - the next request of the session decides afresh
            _degraded(reasons, "affinity_error", exc)
        return "new" if sticky is None else "kept" if chosen == sticky else "moved"

    def _credit_queued(self, candidates: tuple[Candidate, ...], tokens: list[int], count: bool,
                       reasons: list[str]) -> None:
        """Queueing candidates credited with what the requests queued there hold of the prompt. If that fails
        they keep the exact sources' matches and the decision says so."""
        assert self.queued is not None
        try:
            self.queued.credit(candidates, tokens, count)
        except Exception as exc:  # noqa: BLE001 - less credit, the decision goes on
            _degraded(reasons, "queued_prefix_error", exc)

    def _fill_working_set(self, candidates: tuple[Candidate, ...], sampled: list[int], reasons: list[str]) -> None:
        """The working set's view on every candidate, its capacity first brought up to the fleet's last
        scraped one. If that fails the candidates keep their defaults (cache demand unknown: the policy
        reads the fleet as having no room to spare) and the decision says so."""
        if not candidates:
            return
        demand, routes = self._working_view(candidates, sampled, reasons)
        for c in candidates:
            c.cache_demand, c.prefix_routes = demand, routes

    def _working_view(self, candidates: Sequence[Candidate], sampled: list[int] | None, reasons: list[str]
                      ) -> tuple[float | None, float]:
        """(the fleet's cache demand, the popularity of the prompt's prefix held deepest among `candidates`),
        the working set's capacity first brought up to the fleet's last scraped one. (None, 0): no working set
        or prompt, or it failed (cache demand unknown: the policy reads the fleet as having no room to spare),
        and the decision says so."""
        ws = self.working_set
        if ws is None or sampled is None:
            return None, 0.0
        try:
            if self._fleet_capacity is not None:
                capacity = self._fleet_capacity()
                if capacity != self._capacity_seen:
                    self._capacity_seen = capacity
                    ws.set_capacity(capacity / BLOCK_TOKENS)
            return working_view(ws, sampled, max((c.matched_tokens for c in candidates), default=0))
        except Exception as exc:  # noqa: BLE001 - advice lost, the decision goes on without it
            _degraded(reasons, "working_set_error", exc)
            return None, 0.0

    def _plain(self, endpoints: tuple[str, ...], excluded: frozenset[str], matches: dict[str, int], n_tokens: int,
               reasons: list[str]) -> tuple[Candidate, ...]:
        """Every endpoint of the pool less `excluded`, with its load (none known: all idle, and said so)."""
        if excluded:
            endpoints = tuple(ep for ep in endpoints if ep not in excluded)
        try:
            loads = self.loads.loads(endpoints)
        except Exception as exc:  # noqa: BLE001 - no load signal: the policy sees every engine idle
            _degraded(reasons, "loads_error", exc)
            loads = [0.0] * len(endpoints)
        if self.signals is not None and (self.needs.signals or previewing()):
            # The token signals, for a policy that reads them (never pruned) and for Explain; the seed's
            # policies read only matches and loads, and filling the rest would cost every decision.
            now = self.signals.clock()
            return tuple(self.signalled(ep, min(matches.get(ep, 0), n_tokens), load, now)
                         for ep, load in zip(endpoints, loads))
        return tuple(Candidate(ep, min(matches.get(ep, 0), n_tokens), load) for ep, load in zip(endpoints, loads))

    def signalled(self, ep: str, matched: int, load: float, now: float | None = None) -> Candidate:
        """A candidate with the endpoint's token signals: own counts, the scrape's waiting queue and KV usage
        (when fresh), the decode batch (scraped running plus own decisions since, else own count), the
        endpoint's learned TTFT model, and its prefill clock with the idle model that prices it. `now`: the
        signals' clock, read once per decision by the caller (None: read here)."""
        assert self.signals is not None
        if now is None:
            now = self.signals.clock()
        sig = self.signals.get(ep)
        stats = self._fresh_stats(ep) if self._fresh_stats is not None else None
        if sig is None and stats is None:
            return Candidate(ep, matched, load)
        decoding = float(sig.decoding) if sig is not None else 0.0
        waiting, kv = 0.0, None
        if stats is not None:
            waiting, kv = stats.waiting, stats.kv_usage
            correction = self._correction(ep) if self._correction is not None else 0
            decoding = max(decoding, stats.running + correction)
        if sig is None:
            return Candidate(ep, matched, load, decode_batch=decoding, waiting=waiting, kv_usage=kv)
        lane_wait, idle_base, idle_per_token, idle_per_running = sig.prefill_clock.view(now)
        # The one candidate built positionally, in Candidate's field order: it is built once per endpoint per
        # decision, and keywords cost 1.2 µs a candidate against 0.5 (a 1,000-endpoint pool: +0.7 ms).
        # tests/unit/test_load_signals.py pins every field.
        return Candidate(ep, matched, load, float(sig.prefill_tokens), float(sig.uncached_tokens), decoding, waiting,
                         kv, float(sig.prefill_matched_tokens), lane_wait, idle_base, idle_per_token, idle_per_running)

    def _empty(self, request_id: str, subset: frozenset[str] | None, n_tokens: int, stages: dict[str, float],
               started: float, count: bool, model: str | None = None) -> Decision:
        """Nobody to route to: the fleet is empty, nothing in it is in the proxy's subset, or no engine of the
        whole fleet serves the request's model (the gateway answers 404 itself)."""
        fleet = self.registry.snapshot()
        if model is not None and self.models is not None and self.models.pool(model, fleet) == ():
            outcome = "unknown_model"
        else:
            outcome = "no_eligible_endpoints" if subset is not None and fleet else "no_endpoints"
        return self._finish(request_id, (), outcome, [outcome], n_tokens, (), (), stages, started, count, model=model)

    def _finish(self, request_id: str, order: tuple[str, ...], outcome: str, reasons: list[str], n_tokens: int,
                candidates: tuple[Candidate, ...], scores: tuple[float, ...], stages: dict[str, float],
                started: float, count: bool, tokens: list[int] | None = None, model: str | None = None,
                pool_size: int = 0, mean_load: float | None = None, session: str = "", affinity: str = "",
                rule: str = "", state: str = "") -> Decision:
        decision = Decision(request_id, order[0] if order else None, outcome, tuple(reasons), n_tokens, candidates,
                            scores, stages, time.perf_counter() - started, tokens=tokens or None, ranked=order,
                            model=model, pool_size=pool_size or len(candidates), mean_load=mean_load,
                            policy=self.policy.name, rule=rule, session=session, affinity=affinity, state=state)
        if count:  # Explain decides without counting: nothing hears about it
            self.lifecycle.decided(decision)
        return decision


def least_loaded(candidates: tuple[Candidate, ...]) -> Choice:
    """The policy's stand-in when it fails: the lowest load, ties to the lexically smaller endpoint."""
    best = min(range(len(candidates)), key=lambda i: (candidates[i].load, candidates[i].endpoint))
    return Choice(best, tuple(-c.load for c in candidates))


def _degraded(reasons: list[str] | None, reason: str, exc: BaseException) -> None:
    """A helper failed: the decision names it (counted by the decision metrics) and it is logged once per
    reason per interval."""
    if reasons is not None and reason not in reasons:
        reasons.append(reason)
    faults.log(logging.WARNING, reason, "%s: %s", reason, describe(exc))
