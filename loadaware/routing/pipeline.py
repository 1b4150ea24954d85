"""One request's decision: tokenize -> prefix matches -> loads -> policy -> choice.

Every helper is time-boxed and optional; when one fails the decision falls back to the load term alone
and says why. The choice is announced on the request lifecycle (`decided`) with no await between the
loads it was scored on and the announcement, so the in-flight count is taken before any other request
can be scored (docs/architecture.md, "Invariants").
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.load.signals import SignalTracker
from loadaware.policies import Candidate, Policy, ranked
from loadaware.prefix.source import PrefixSource, PrefixUnavailable, SaltedTokens
from loadaware.routing.request import InferenceRequest

log = logging.getLogger(__name__)

ALL_FAILING = "all_endpoints_failing"


class Loads(Protocol):
    def loads(self, endpoints: tuple[str, ...]) -> list[float]: ...


class Eligibility(Protocol):
    def eligible(self, endpoints: tuple[str, ...]) -> tuple[str, ...]: ...


class ModelPools(Protocol):
    def pool(self, model: str, endpoints: tuple[str, ...]) -> tuple[str, ...] | None: ...


class PromptEncoder(Protocol):
    async def encode_prompt(self, prompt: str) -> list[int]: ...

    async def encode_chat(self, messages: list[dict[str, object]], options: dict[str, object] | None = None
                          ) -> list[int]: ...


class Decider:
    def __init__(self, policy: Policy, registry: EndpointRegistry, loads: Loads, lifecycle: RequestLifecycle,
                 tokenizer: PromptEncoder | None = None, prefix_source: PrefixSource | None = None,
                 fallbacks: int = 0, health: Eligibility | None = None, models: ModelPools | None = None,
                 signals: SignalTracker | None = None) -> None:
        self.policy = policy
        self.signals = signals  # per-endpoint token signals (load/signals.py); None: candidates carry none
        self._fresh_stats = getattr(loads, "fresh_stats", None)  # bound once: the candidates are the hot path
        self._correction = getattr(loads, "snapshot_correction", None)
        self.health = health  # engines failing their requests are left out (fleet/health.py)
        self.models = models  # which engines serve which model (None: model awareness off)
        self.fallbacks = fallbacks  # next-best endpoints named after the choice, for the proxy's retries
        self.registry = registry
        self.loads = loads
        self.lifecycle = lifecycle
        self.tokenizer = tokenizer
        self.prefix_source = prefix_source

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

    def endpoints(self, subset: frozenset[str] | None, model: str | None = None) -> tuple[str, ...]:
        """The fleet, or the part of it in the proxy's subset hint; then only the engines serving `model`
        when their models are known. A model's engines are its own fleet: the policy compares loads (and
        takes the mean) over what this returns (docs/architecture.md, "Model pools")."""
        fleet = self.registry.snapshot()
        eligible = fleet if subset is None else tuple(ep for ep in fleet if ep in subset)
        if model is None or self.models is None:
            return eligible
        pool = self.models.pool(model, eligible)
        return eligible if pool is None else pool

    def candidates(self, subset: frozenset[str] | None, model: str | None, reasons: list[str]) -> tuple[str, ...]:
        """The endpoints a decision may choose: the model's pool in the fleet (or subset) less the engines
        failing their requests. If that leaves nobody, the whole pool (fail open: the proxy's retries and
        outlier detection still act), and the decision says so."""
        endpoints = self.endpoints(subset, model)
        if self.health is None or not endpoints:
            return endpoints
        eligible = self.health.eligible(endpoints)
        if eligible:
            return eligible
        if ALL_FAILING not in reasons:
            reasons.append(ALL_FAILING)
        return endpoints

    async def prefix_matches(self, tokens: list[int], endpoints: tuple[str, ...], reasons: list[str],
                             salt: str | None = None) -> dict[str, int]:
        if self.prefix_source is None:
            reasons.append("no_prefix_source")
            return {}
        try:
            return await self.prefix_source.matches(tokens, endpoints, salt)
        except PrefixUnavailable as exc:
            reasons.append(exc.reason)
            return {}

    async def decide(self, request: InferenceRequest | None, request_id: str = "", count: bool = True,
                     parse_s: float | None = None, subset: frozenset[str] | None = None) -> Decision:
        """`subset`: the proxy's hint; only endpoints in it are candidates (None: the whole fleet)."""
        started = time.perf_counter()
        stages: dict[str, float] = {} if parse_s is None else {"parse": parse_s}
        reasons: list[str] = []
        tokens: list[int] = []
        matches: dict[str, int] = {}
        model = request.model if request is not None else None
        endpoints = self.candidates(subset, model, reasons)
        if not endpoints:
            return self._empty(request_id, subset, 0, stages, started, count, model)
        if request is None or not request.has_prompt:
            reasons.append("no_prompt")
        elif self.policy.uses_prefix:
            t = time.perf_counter()
            try:
                tokens = await self.prompt_tokens(request)
            except LookupError as exc:  # no tokenizer, or no chat template that renders (told once at start)
                reasons.append(str(exc.args[0]) if exc.args else "no_tokenizer")
            except TimeoutError:
                reasons.append("tokenizer_timeout")
            except Exception as exc:  # noqa: BLE001 - any tokenizer failure degrades, never fails, the request
                log.info("request_id=%s tokenizer failed: %s", request_id, exc)
                reasons.append("tokenizer_error")
            stages["tokenize"] = time.perf_counter() - t
            if tokens and request.cache_salt:
                # The salt keys the engine's prefix cache as much as the tokens do; it travels with them (the
                # approximate index records the decision's tokens under it).
                tokens = SaltedTokens(tokens, request.cache_salt)
            if tokens:
                t = time.perf_counter()
                matches = await self.prefix_matches(tokens, endpoints, reasons, request.cache_salt)
                stages["lookup"] = time.perf_counter() - t
        # Fresh snapshot after the awaits: an endpoint may have left meanwhile. From here on, no await.
        t = time.perf_counter()
        endpoints = self.candidates(subset, model, reasons)
        if not endpoints:
            return self._empty(request_id, subset, len(tokens), stages, started, count, model)
        loads = self.loads.loads(endpoints)
        n_tokens = len(tokens)
        if self.signals is None:
            candidates = tuple(Candidate(ep, min(matches.get(ep, 0), n_tokens), load)
                               for ep, load in zip(endpoints, loads))
        else:
            candidates = tuple(self.signalled(ep, min(matches.get(ep, 0), n_tokens), load)
                               for ep, load in zip(endpoints, loads))
        choice = self.policy.choose(n_tokens, candidates)
        assert choice is not None  # candidates is non-empty here
        stages["score"] = time.perf_counter() - t
        # Failing engines left out is news, not a lost helper: the decision still used every signal.
        outcome = "fallback_load_only" if reasons and reasons != [ALL_FAILING] else "routed"
        order = tuple(candidates[i].endpoint for i in ranked(choice, candidates, 1 + self.fallbacks))
        return self._finish(request_id, order, outcome, reasons, n_tokens, candidates, choice.scores, stages,
                            started, count, tokens)

    def signalled(self, ep: str, matched: int, load: float) -> Candidate:
        """A candidate with the endpoint's token signals: own counts, the scrape's waiting queue and KV usage
        (when fresh), the decode batch (scraped running plus own decisions since, else own count), and the
        endpoint's learned TTFT model."""
        assert self.signals is not None
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
        m = sig.model
        learned = m.observations > 0
        return Candidate(ep, matched, load, float(sig.prefill_tokens), float(sig.uncached_tokens), decoding, waiting,
                         kv, ttft_base_s=m.base_s if learned else None,
                         ttft_per_token_s=m.per_token_s if learned else None,
                         ttft_per_running_s=m.per_running_s if learned else None)

    def _empty(self, request_id: str, subset: frozenset[str] | None, n_tokens: int, stages: dict[str, float],
               started: float, count: bool, model: str | None = None) -> Decision:
        """Nobody to route to: the fleet is empty, nothing in it is in the proxy's subset, or no engine of the
        whole fleet serves the request's model (the gateway answers 404 itself)."""
        fleet = self.registry.snapshot()
        if model is not None and self.models is not None and self.models.pool(model, fleet) == ():
            outcome = "unknown_model"
        else:
            outcome = "no_eligible_endpoints" if subset is not None and fleet else "no_endpoints"
        return self._finish(request_id, (), outcome, [outcome], n_tokens, (), (), stages, started, count)

    def _finish(self, request_id: str, order: tuple[str, ...], outcome: str, reasons: list[str], n_tokens: int,
                candidates: tuple[Candidate, ...], scores: tuple[float, ...], stages: dict[str, float],
                started: float, count: bool, tokens: list[int] | None = None) -> Decision:
        decision = Decision(request_id, order[0] if order else None, outcome, tuple(reasons), n_tokens, candidates,
                            scores, stages, time.perf_counter() - started, tokens=tokens or None, ranked=order)
        if count:  # Explain decides without counting: nothing hears about it
            self.lifecycle.decided(decision)
        return decision
