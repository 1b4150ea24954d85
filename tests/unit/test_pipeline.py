"""The decision pipeline with in-process sources: fallbacks, counting through the request lifecycle, and the
endpoint set moving under it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.load.tracker import LoadTracker
from loadaware.policies import make_policy
from loadaware.policies.base import Candidate
from loadaware.prefix.source import PrefixUnavailable
from loadaware.routing.builder import build_decider
from loadaware.routing.filters import ModelPools
from loadaware.routing.request import InferenceRequest
from loadaware.telemetry.decisions import DecisionMetrics, RecentDecisions
from loadaware.telemetry.metrics import Metrics
from loadaware.tokenize.tokenizer import AsyncTokenizer, PromptTokenizer

TOKENIZER = "sim/assets/tiny-model"
FLEET = ("127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000")


class FixedSource:
    name = "fixed"

    def __init__(self, answer: dict[str, int] | None = None, error: str | None = None, delay: float = 0.0,
                 registry: EndpointRegistry | None = None) -> None:
        self.answer = answer or {}
        self.error = error
        self.delay = delay
        self.registry = registry
        self.calls = 0

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.registry is not None:  # the fleet changes while we wait
            self.registry.set(FLEET[1:])
        if self.error:
            raise PrefixUnavailable(self.error)
        return dict(self.answer)


class Rig:
    """A decider wired as the app wires it: the load tracker, metrics and the recent ring listen."""

    def __init__(self, policy: str, source: FixedSource | None, tokenizer: bool, fleet: Sequence[str],
                 fallbacks: int = 0, models: ModelPools | None = None) -> None:
        self.loads = LoadTracker(stale_s=5)
        self.metrics = Metrics(policy)
        self.recent = RecentDecisions()
        lifecycle = RequestLifecycle()
        for listener in (self.loads, DecisionMetrics(self.metrics), self.recent):
            lifecycle.subscribe(listener)
        tok = AsyncTokenizer(PromptTokenizer(TOKENIZER), timeout_s=2.0) if tokenizer else None
        self.decider = build_decider(make_policy(policy), EndpointRegistry(fleet), self.loads, lifecycle, tok, source,
                               fallbacks=fallbacks, models=models)
        self.decide = self.decider.decide


def make(policy: str = "loadaware", source: FixedSource | None = None, tokenizer: bool = True,
         fleet: Sequence[str] = FLEET) -> Rig:
    return Rig(policy, source, tokenizer, fleet)


PROMPT = InferenceRequest("completions", prompt="the engine cache prefix token " * 100)


async def test_routes_to_the_holder_and_counts_it() -> None:
    d = make(source=FixedSource({"127.0.0.3:8000": 10_000}))
    decision = await d.decide(PROMPT, "r1")
    assert decision.endpoint == "127.0.0.3:8000" and decision.outcome == "routed"
    assert decision.prompt_tokens > 100 and decision.reasons == ()
    assert d.loads.count("127.0.0.3:8000") == 1 and decision.lease is not None
    assert list(d.recent.items) == [decision]
    assert d.metrics.decisions.value("loadaware", "127.0.0.3:8000", "routed") == 1
    assert set(decision.stages) == {"tokenize", "lookup", "score"}
    # matched tokens are capped at the prompt length
    assert max(c.matched_tokens for c in decision.candidates) == decision.prompt_tokens


async def test_explain_does_not_count() -> None:
    d = make(source=FixedSource({"127.0.0.3:8000": 512}))
    decision = await d.decide(PROMPT, "r1", count=False)
    assert decision.endpoint == "127.0.0.3:8000" and decision.lease is None
    assert d.loads.total() == 0 and len(d.recent.items) == 0


@pytest.mark.parametrize("error", ["lmcache_error", "lmcache_timeout"])
async def test_prefix_failure_falls_back_to_load(error: str) -> None:
    d = make(source=FixedSource(error=error))
    d.loads.acquire("127.0.0.2:8000")
    decision = await d.decide(PROMPT)
    assert decision.outcome == "fallback_load_only" and decision.reasons == (error,)
    assert d.metrics.fallbacks.labels(error)._value.get() == 1  # the reason is counted, not just reported
    assert decision.endpoint != "127.0.0.2:8000"  # the load term still acts


async def test_tokenizer_missing_or_failing() -> None:
    d = make(source=FixedSource({"127.0.0.3:8000": 512}), tokenizer=False)
    decision = await d.decide(PROMPT)
    assert decision.reasons == ("no_tokenizer",) and decision.endpoint is not None
    # pre-tokenized prompts need no tokenizer
    decision = await d.decide(InferenceRequest("completions", prompt=list(range(600))))
    assert decision.reasons == () and decision.endpoint == "127.0.0.3:8000"
    d = make(source=FixedSource())
    bad_chat = InferenceRequest("chat", messages=[{"role": "user", "content": {"odd": 1}}])
    decision = await d.decide(bad_chat)
    # The template cannot render a dict as content: the decision says so and still routes on load.
    assert decision.reasons == ("tokenizer_error",) and decision.outcome == "fallback_load_only"
    assert decision.prompt_tokens == 0 and decision.endpoint is not None


async def test_tokenizer_timeout_is_time_boxed() -> None:
    d = make(source=FixedSource())
    assert isinstance(d.decider.producers.tokenizer, AsyncTokenizer)
    d.decider.producers.tokenizer.timeout_s = 1e-6
    decision = await d.decide(InferenceRequest("completions", prompt=" ".join(str(i) for i in range(50000))))
    assert "tokenizer_timeout" in decision.reasons and decision.endpoint is not None


async def test_no_prompt_and_empty_fleet() -> None:
    d = make(source=FixedSource())
    decision = await d.decide(None)
    assert decision.reasons == ("no_prompt",) and decision.endpoint is not None
    d = make(source=FixedSource(), fleet=())
    decision = await d.decide(PROMPT)
    assert decision.endpoint is None and decision.outcome == "no_endpoints" and d.loads.total() == 0


async def test_endpoint_vanishing_during_lookup_is_never_chosen() -> None:
    d = make()
    d.decider.producers.prefix_source = FixedSource({"127.0.0.2:8000": 10_000}, registry=d.decider.registry)
    decision = await d.decide(PROMPT)
    assert decision.endpoint in FLEET[1:]
    assert [c.endpoint for c in decision.candidates] == list(FLEET[1:])


async def test_policies_without_prefix_skip_the_lookup() -> None:
    source = FixedSource({"127.0.0.2:8000": 10_000})
    d = make("leastload", source=source)
    decision = await d.decide(PROMPT)
    assert source.calls == 0 and "tokenize" not in decision.stages and decision.outcome == "routed"


async def test_lifecycle_counts_once_moves_with_the_server_and_ends_once() -> None:
    d = make(source=FixedSource({"127.0.0.3:8000": 10_000}))
    lifecycle = d.decider.lifecycle
    decision = await d.decide(PROMPT, "r1")
    assert decision.endpoint == "127.0.0.3:8000" and decision.served == decision.endpoint
    lifecycle.served(decision, "127.0.0.3:8000")  # the chosen engine served: no news
    assert d.loads.snapshot() == {"127.0.0.3:8000": 1}
    lifecycle.served(decision, "127.0.0.4:8000")  # a retry walked the ranked list
    assert decision.served == "127.0.0.4:8000"
    assert d.loads.count("127.0.0.3:8000") == 0 and d.loads.count("127.0.0.4:8000") == 1
    assert decision.tokens is None  # dropped once announced: a request in flight does not keep its prompt
    lifecycle.ended(decision)
    lifecycle.ended(decision)  # a second end (cancel after EOF) must not release twice
    lifecycle.served(decision, "127.0.0.2:8000")  # too late: the request is over
    assert d.loads.total() == 0
    assert "tokens" not in decision.as_dict()  # the debug ring never renders the prompt


def test_debug_rendering_shows_the_signals_a_candidate_carried() -> None:
    signalled = Candidate("a", 1536, 3.0, prefill_tokens=42.0, decode_batch=2.0, waiting=1.0, kv_usage=0.5,
                          idle_ttft_per_token_s=2.5e-4)
    plain = Candidate("b", 0, 1.0)  # a seed policy's candidate: matched tokens and load only
    rendered = Decision("r", "a", "routed", (), 1578, (signalled, plain), (-0.1, -0.4), {}, 0.0).as_dict()
    assert rendered["candidates"] == [
        {"endpoint": "a", "matched_tokens": 1536, "load": 3.0, "prefill_tokens": 42.0, "decode_batch": 2.0,
         "waiting": 1.0, "kv_usage": 0.5, "idle_ttft_per_token_s": 2.5e-4, "score": -0.1},
        {"endpoint": "b", "matched_tokens": 0, "load": 1.0, "score": -0.4}]
    assert "rule" not in rendered  # the policy's usual rule chose
    assert Decision("r", "a", "routed", (), 1, (plain,), (0.0,), {}, 0.0, rule="all_queueing").as_dict()["rule"] == \
        "all_queueing"


async def test_a_failing_listener_does_not_leak_the_count() -> None:
    class Broken:
        def on_decided(self, decision: object) -> None:
            raise RuntimeError("listener bug")

        def on_served(self, decision: object, previous: object) -> None:
            raise RuntimeError("listener bug")

        def on_ended(self, decision: object) -> None:
            raise RuntimeError("listener bug")

    d = make(source=FixedSource({"127.0.0.3:8000": 10_000}))
    d.decider.lifecycle.subscribe(Broken())
    decision = await d.decide(PROMPT, "r1")
    assert d.loads.count("127.0.0.3:8000") == 1 and d.recent.items[-1] is decision
    d.decider.lifecycle.ended(decision)
    assert d.loads.total() == 0
