"""One request's decision: tokenize -> prefix matches -> loads -> policy -> choice.

Every helper is time-boxed and optional; when one fails the decision falls back to the load term alone
and says why. The in-flight count is taken at the moment of choice, with no await in between.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from loadaware.policies import Candidate, Policy
from loadaware.fleet.registry import EndpointRegistry
from loadaware.load.inflight import InflightTracker, Lease
from loadaware.load.view import LoadView
from loadaware.prefix.source import PrefixSource, PrefixUnavailable
from loadaware.tokenize.tokenizer import AsyncTokenizer
from loadaware.telemetry.metrics import Metrics
from loadaware.routing.request import InferenceRequest

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Decision:
    request_id: str
    endpoint: str | None
    outcome: str  # routed | fallback_load_only | no_endpoints
    reasons: tuple[str, ...]
    prompt_tokens: int
    candidates: tuple[Candidate, ...]
    scores: tuple[float, ...]
    stages: dict[str, float]
    total_s: float
    lease: Lease | None = None
    at: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id, "endpoint": self.endpoint, "outcome": self.outcome,
            "reasons": list(self.reasons), "prompt_tokens": self.prompt_tokens,
            "candidates": [{"endpoint": c.endpoint, "matched_tokens": c.matched_tokens, "load": c.load,
                            "score": s} for c, s in zip(self.candidates, self.scores)],
            "stages_ms": {k: round(v * 1e3, 3) for k, v in self.stages.items()},
            "total_ms": round(self.total_s * 1e3, 3), "at": self.at,
        }


class Decider:
    def __init__(self, policy: Policy, registry: EndpointRegistry, loads: LoadView, inflight: InflightTracker,
                 metrics: Metrics, tokenizer: AsyncTokenizer | None = None,
                 prefix_source: PrefixSource | None = None, recent: int = 256,
                 on_routed: Callable[[Sequence[int], str], None] | None = None) -> None:
        self.policy = policy
        self.registry = registry
        self.loads = loads
        self.inflight = inflight
        self.metrics = metrics
        self.tokenizer = tokenizer
        self.prefix_source = prefix_source
        self.recent: deque[Decision] = deque(maxlen=recent)
        self.on_routed = on_routed  # hears (prompt tokens, endpoint) of each counted routing (approx source)
        self._last_fallback_log: dict[str, float] = {}

    async def prompt_tokens(self, request: InferenceRequest) -> list[int]:
        """Token ids as the engine will see them; raises on tokenizer failure or timeout."""
        if request.messages is not None:
            if self.tokenizer is None:
                raise LookupError("no_tokenizer")
            return await self.tokenizer.encode_chat(request.messages)
        if isinstance(request.prompt, list):
            return request.prompt
        if self.tokenizer is None:
            raise LookupError("no_tokenizer")
        return await self.tokenizer.encode_prompt(request.prompt or "")

    async def prefix_matches(self, tokens: list[int], reasons: list[str]) -> dict[str, int]:
        if self.prefix_source is None:
            reasons.append("no_prefix_source")
            return {}
        try:
            return await self.prefix_source.matches(tokens, self.registry.snapshot())
        except PrefixUnavailable as exc:
            reasons.append(exc.reason)
            return {}

    async def decide(self, request: InferenceRequest | None, request_id: str = "", count: bool = True,
                     parse_s: float | None = None) -> Decision:
        started = time.perf_counter()
        stages: dict[str, float] = {} if parse_s is None else {"parse": parse_s}
        reasons: list[str] = []
        tokens: list[int] = []
        matches: dict[str, int] = {}
        if not self.registry.snapshot():
            decision = self._finish(request_id, None, "no_endpoints", ["no_endpoints"], 0, (), (), stages,
                                    started, count)
            return decision
        if request is None or not request.has_prompt:
            reasons.append("no_prompt")
        elif self.policy.uses_prefix:
            t = time.perf_counter()
            try:
                tokens = await self.prompt_tokens(request)
            except LookupError:
                reasons.append("no_tokenizer")
            except TimeoutError:
                reasons.append("tokenizer_timeout")
            except Exception as exc:  # noqa: BLE001 - any tokenizer failure degrades, never fails, the request
                log.info("request_id=%s tokenizer failed: %s", request_id, exc)
                reasons.append("tokenizer_error")
            stages["tokenize"] = time.perf_counter() - t
            if tokens:
                t = time.perf_counter()
                matches = await self.prefix_matches(tokens, reasons)
                stages["lookup"] = time.perf_counter() - t
        # Fresh snapshot after the awaits: an endpoint may have left meanwhile. From here on, no await.
        t = time.perf_counter()
        endpoints = self.registry.snapshot()
        if not endpoints:
            return self._finish(request_id, None, "no_endpoints", ["no_endpoints"], len(tokens), (), (),
                                stages, started, count)
        loads = self.loads.loads(endpoints)
        n_tokens = len(tokens)
        candidates = tuple(Candidate(ep, min(matches.get(ep, 0), n_tokens), load)
                           for ep, load in zip(endpoints, loads))
        choice = self.policy.choose(n_tokens, candidates)
        assert choice is not None  # candidates is non-empty here
        stages["score"] = time.perf_counter() - t
        outcome = "fallback_load_only" if reasons else "routed"
        decision = self._finish(request_id, candidates[choice.index].endpoint, outcome, reasons, n_tokens,
                                candidates, choice.scores, stages, started, count)
        if self.on_routed is not None and count and tokens and decision.endpoint is not None:
            self.on_routed(tokens, decision.endpoint)
        return decision

    def _finish(self, request_id: str, endpoint: str | None, outcome: str, reasons: list[str], n_tokens: int,
                candidates: tuple[Candidate, ...], scores: tuple[float, ...], stages: dict[str, float],
                started: float, count: bool) -> Decision:
        lease = self.inflight.acquire(endpoint) if (count and endpoint is not None) else None
        total = time.perf_counter() - started
        decision = Decision(request_id, endpoint, outcome, tuple(reasons), n_tokens, candidates, scores,
                            stages, total, lease)
        if not count:
            return decision
        self.recent.append(decision)
        m = self.metrics
        m.decided(endpoint or "none", outcome)
        for reason in reasons:
            m.fallback(reason)
        m.decision_seconds.observe(total)
        for stage, seconds in stages.items():
            m.stage(stage, seconds)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request_id=%s endpoint=%s outcome=%s reasons=%s tokens=%d scores=%s", request_id,
                      endpoint, outcome, ",".join(reasons) or "-", n_tokens,
                      ",".join(f"{c.endpoint}:{c.matched_tokens}/{c.load:g}={s:.3f}"
                               for c, s in zip(candidates, scores)))
        elif reasons and reasons != ["no_prompt"]:
            now = time.monotonic()
            key = ",".join(reasons)
            if now - self._last_fallback_log.get(key, 0.0) >= 1.0:  # a dead helper must not flood the log
                self._last_fallback_log[key] = now
                log.warning("request_id=%s endpoint=%s fell back to load only: %s", request_id, endpoint, key)
        return decision
