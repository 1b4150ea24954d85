"""Token-level signals per endpoint (loadaware.load.signals) through the real decision pipeline and
request lifecycle: routed-minus-matched tokens counted at the decision, retired at the first response chunk
or the end, moved by a retry, learned TTFT, and the candidates the policy then sees."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import ClassVar

import pytest

from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import RequestLifecycle
from loadaware.load.signals import EndpointSignals, SignalTracker
from loadaware.load.tracker import EngineStats, LoadTracker
from loadaware.policies import Candidate, Needs, Policy, make_policy
from loadaware.policies.kvaware import KvAware
from loadaware.policies.lane import Lane
from loadaware.policies.ttft_model import TtftPrior
from loadaware.routing.builder import build_decider
from loadaware.routing.pipeline import Decider
from loadaware.routing.request import InferenceRequest
from research.candidates import with_ttft_models
from research.predictive import Predictive

FLEET = ("127.0.0.2:8000", "127.0.0.3:8000")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Matches:
    name = "fixed"

    def __init__(self, answer: dict[str, int]) -> None:
        self.answer = answer

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        return dict(self.answer)


RESEARCH: dict[str, Callable[[], Policy]] = {"lane": Lane, "predictive": Predictive}  # not offered by --policy


class SignalledKvAware(KvAware):
    needs: ClassVar[Needs] = Needs(signals=True)


def observations(s: EndpointSignals) -> int:
    """How many first chunks the endpoint's TTFT model over every request has learned from."""
    return s.model.observations if s.model is not None else 0


def rig(answer: dict[str, int], policy: str = "kvaware", ttft_model: bool = True
        ) -> tuple[Decider, SignalTracker, RequestLifecycle, Clock, LoadTracker]:
    """A decider on a fake clock; its tracker learns the TTFT model over every request unless told not to (the
    sidecar does not: no product policy reads it; the research arm does, in the simulator)."""
    clock = Clock()
    loads = LoadTracker(stale_s=5, clock=clock)
    signals = SignalTracker(clock=clock, ttft_model=ttft_model)
    lifecycle = RequestLifecycle()
    lifecycle.subscribe(loads)
    lifecycle.subscribe(signals)
    lifecycle.subscribe_progress(signals)
    registry = EndpointRegistry(FLEET)
    decider = build_decider(
        RESEARCH[policy]() if policy in RESEARCH else make_policy(policy), registry, loads, lifecycle,
                      prefix_source=Matches(answer), signals=signals)
    return decider, signals, lifecycle, clock, loads


def prompt(n: int) -> InferenceRequest:
    return InferenceRequest("completions", prompt=list(range(n)), model="m")


def test_uncached_tokens_are_counted_at_the_decision_and_retired_at_first_chunk_and_end() -> None:
    decider, signals, lifecycle, clock, _ = rig({FLEET[0]: 600})
    d = asyncio.run(decider.decide(prompt(1000), "r1"))
    assert d.endpoint == FLEET[0]
    s = signals.get(FLEET[0])
    assert s is not None and (s.prefill_tokens, s.uncached_tokens, s.decoding) == (400, 400, 0)
    clock.t += 0.25
    lifecycle.first_chunk(d)
    lifecycle.first_chunk(d)  # once per request, whatever the response path repeats
    assert (s.prefill_tokens, s.uncached_tokens, s.decoding) == (0, 400, 1)
    assert s.ttft_s == 0.25 and observations(s) == 1
    lifecycle.ended(d)
    assert (s.prefill_tokens, s.uncached_tokens, s.decoding) == (0, 0, 0)


def test_prefix_held_tokens_are_counted_beside_the_uncached_and_feed_the_ttft_model() -> None:
    decider, signals, lifecycle, clock, _ = rig({FLEET[0]: 600})
    decider.policy = SignalledKvAware()  # kvaware's choices, with candidates that show
    # the signals (kvaware itself reads none), the TTFT model's prices among them as a policy that reads them sees
    first = asyncio.run(decider.decide(prompt(1000), "r1"))
    second = asyncio.run(decider.decide(prompt(1000), "r2"))
    assert first.endpoint == second.endpoint == FLEET[0]
    s = signals.get(FLEET[0])
    assert s is not None and (s.prefill_tokens, s.prefill_matched_tokens) == (800, 1200)
    third = asyncio.run(decider.decide(prompt(1000), "r3"))
    held = {c.endpoint: c for c in third.candidates}[FLEET[0]]
    assert held.prefill_matched_tokens == 1200
    assert with_ttft_models([held], signals)[0].ttft_per_matched_token_s is None  # nothing observed yet
    for d in (first, second):
        clock.t += 0.2
        lifecycle.first_chunk(d)
    assert (s.prefill_tokens, s.prefill_matched_tokens) == (400, 600)  # the third is still ahead
    assert observations(s) == 2
    lifecycle.ended(third)
    assert (s.prefill_tokens, s.prefill_matched_tokens) == (0, 0)
    fourth = asyncio.run(decider.decide(prompt(1000), "r4"))
    held = {c.endpoint: c for c in fourth.candidates}[FLEET[0]]
    # learned from the two first chunks, as the research arm that reads it sees it (research.candidates)
    assert with_ttft_models([held], signals)[0].ttft_per_matched_token_s is not None


def test_a_request_that_ends_without_a_first_chunk_retires_its_prefill() -> None:
    decider, signals, lifecycle, _, _ = rig({})
    d = asyncio.run(decider.decide(prompt(300), "r1"))
    assert d.endpoint is not None
    s = signals.get(d.endpoint)
    assert s is not None and s.prefill_tokens == 300
    lifecycle.ended(d)
    assert (s.prefill_tokens, s.uncached_tokens, s.decoding, s.ttft_s) == (0, 0, 0, None)


def test_a_retry_moves_the_counts_to_the_engine_that_served() -> None:
    decider, signals, lifecycle, _, _ = rig({FLEET[0]: 600})
    d = asyncio.run(decider.decide(prompt(1000), "r1"))
    lifecycle.served(d, FLEET[1])
    a, b = signals.get(FLEET[0]), signals.get(FLEET[1])
    assert a is not None and b is not None
    assert (a.prefill_tokens, a.uncached_tokens, a.prefill_matched_tokens) == (0, 0, 0)
    assert (b.prefill_tokens, b.uncached_tokens, b.prefill_matched_tokens) == (400, 400, 600)
    lifecycle.first_chunk(d)
    lifecycle.ended(d)
    assert (b.prefill_tokens, b.uncached_tokens, b.decoding) == (0, 0, 0)


def test_the_next_decision_sees_the_signals_and_the_fresh_scrape() -> None:
    decider, signals, _, clock, loads = rig({FLEET[0]: 600})
    first = asyncio.run(decider.decide(prompt(1000), "r1"))
    assert first.endpoint == FLEET[0]
    loads.record(FLEET[1], EngineStats(running=7, waiting=2, kv_usage=0.4, at=clock.t))
    decider.policy = Predictive()  # a policy that reads the signals
    second = asyncio.run(decider.decide(prompt(1000), "r2"))
    by_ep = {c.endpoint: c for c in second.candidates}
    held, other = by_ep[FLEET[0]], by_ep[FLEET[1]]
    assert (held.prefill_tokens, held.uncached_tokens, held.decode_batch) == (400, 400, 0)
    assert held.kv_usage is None and held.idle_ttft_base_s is None  # no scrape, no first chunk yet
    assert (other.waiting, other.kv_usage, other.decode_batch) == (2, 0.4, 7)
    signals.drop(FLEET[0])
    assert signals.get(FLEET[0]) is None


def learned_ttft(signals: SignalTracker, loads: LoadTracker, clock: Clock, endpoint: str, mean_s: float) -> None:
    """Two scrapes of `endpoint` whose TTFT histogram says its first tokens took `mean_s` on average."""
    loads.subscribe_scrapes(signals.scraped)
    loads.record(endpoint, EngineStats(0, 0, None, clock.t, ttft_sum=0.0, ttft_count=0.0))
    loads.record(endpoint, EngineStats(0, 0, None, clock.t, ttft_sum=100 * mean_s, ttft_count=100.0))


def test_buffered_mode_retires_prefill_one_mean_ttft_after_the_decision() -> None:
    decider, signals, lifecycle, clock, loads = rig({FLEET[0]: 600})
    learned_ttft(signals, loads, clock, FLEET[0], 0.5)
    d = asyncio.run(decider.decide(prompt(1000), "r1"))
    assert d.endpoint == FLEET[0]
    s = signals.get(FLEET[0])
    assert s is not None and (s.prefill_tokens, s.uncached_tokens, s.decoding) == (400, 400, 0)
    clock.t += 0.4
    s = signals.get(FLEET[0])
    assert s is not None and s.prefill_tokens == 400  # not yet one mean TTFT
    clock.t += 0.2
    s = signals.get(FLEET[0])
    assert s is not None and (s.prefill_tokens, s.uncached_tokens, s.decoding) == (0, 400, 1)
    lifecycle.ended(d)
    assert (s.prefill_tokens, s.uncached_tokens, s.decoding) == (0, 0, 0)
    assert s.ttft_s is None and observations(s) == 0  # an estimate teaches the TTFT model nothing


def test_peek_reads_without_settling_the_estimate() -> None:
    """`peek` (what the /metrics page, rendered off the event loop, reads) changes nothing: a prefill whose
    estimate is due stays counted until `get` (on the loop) settles it."""
    decider, signals, _, clock, loads = rig({FLEET[0]: 600})
    learned_ttft(signals, loads, clock, FLEET[0], 0.5)
    asyncio.run(decider.decide(prompt(1000), "r1"))
    clock.t += 0.6  # past one mean TTFT: due
    peeked = signals.peek(FLEET[0])
    assert peeked is not None and peeked.pending and (peeked.prefill_tokens, peeked.decoding) == (400, 0)
    assert signals.peek(FLEET[0]) is peeked and peeked.prefill_tokens == 400  # a second read: still nothing moved
    settled = signals.get(FLEET[0])
    assert settled is peeked and not settled.pending and (settled.prefill_tokens, settled.decoding) == (0, 1)


def test_an_end_before_the_estimate_retires_once_and_the_queue_keeps_decision_order() -> None:
    decider, signals, lifecycle, clock, loads = rig({FLEET[0]: 600})
    learned_ttft(signals, loads, clock, FLEET[0], 1.0)
    first = asyncio.run(decider.decide(prompt(1000), "r1"))
    clock.t += 0.5
    second = asyncio.run(decider.decide(prompt(1000), "r2"))
    assert first.endpoint == second.endpoint == FLEET[0]
    lifecycle.ended(first)  # a short answer: over before its estimated first token
    s = signals.get(FLEET[0])
    assert s is not None and (s.prefill_tokens, s.uncached_tokens, s.decoding) == (400, 400, 0)
    clock.t += 0.6  # past the first's due time (it is gone), not yet the second's
    assert signals.get(FLEET[0]) is s and s.prefill_tokens == 400
    clock.t += 0.5
    assert signals.get(FLEET[0]) is s and (s.prefill_tokens, s.decoding) == (0, 1)
    lifecycle.ended(second)
    assert (s.prefill_tokens, s.uncached_tokens, s.decoding) == (0, 0, 0) and not s.pending


def test_without_a_learned_mean_prefill_waits_for_the_end() -> None:
    decider, signals, lifecycle, clock, loads = rig({})
    loads.subscribe_scrapes(signals.scraped)
    loads.record(FLEET[0], EngineStats(0, 0, None, clock.t))  # an engine without the histogram
    d = asyncio.run(decider.decide(prompt(300), "r1"))
    assert d.endpoint is not None
    clock.t += 60
    s = signals.get(d.endpoint)
    assert s is not None and s.prefill_tokens == 300 and not s.pending
    lifecycle.ended(d)
    assert s.prefill_tokens == 0


def test_a_first_chunk_stops_the_estimate_and_still_teaches_the_model() -> None:
    decider, signals, lifecycle, clock, loads = rig({FLEET[0]: 600})
    learned_ttft(signals, loads, clock, FLEET[0], 0.5)
    early = asyncio.run(decider.decide(prompt(1000), "r1"))
    late = asyncio.run(decider.decide(prompt(1000), "r2"))
    clock.t += 0.6
    s = signals.get(FLEET[0])  # both estimated prefilled
    assert s is not None and (s.prefill_tokens, s.decoding) == (0, 2)
    lifecycle.first_chunk(early)  # the response path is there after all
    assert not signals.estimating and (s.prefill_tokens, s.decoding) == (0, 2)
    assert observations(s) == 1 and s.ttft_s == pytest.approx(0.6)
    third = asyncio.run(decider.decide(prompt(1000), "r3"))
    clock.t += 5
    assert third.endpoint == FLEET[0] and signals.get(FLEET[0]) is s
    assert s.prefill_tokens == 400  # no estimate any more: its first chunk retires it
    lifecycle.first_chunk(third)
    assert (s.prefill_tokens, s.decoding) == (0, 3)
    for d in (early, late, third):
        lifecycle.ended(d)
    assert (s.prefill_tokens, s.uncached_tokens, s.decoding) == (0, 0, 0)


def test_a_retry_moves_an_estimated_request_to_the_engine_that_served() -> None:
    decider, signals, lifecycle, clock, loads = rig({FLEET[0]: 600})
    learned_ttft(signals, loads, clock, FLEET[0], 0.5)
    learned_ttft(signals, loads, clock, FLEET[1], 2.0)
    d = asyncio.run(decider.decide(prompt(1000), "r1"))
    lifecycle.served(d, FLEET[1])
    clock.t += 1.0  # past the first engine's mean, not the second's
    a, b = signals.get(FLEET[0]), signals.get(FLEET[1])
    assert a is not None and b is not None and not a.pending
    assert (a.prefill_tokens, a.decoding) == (0, 0) and (b.prefill_tokens, b.decoding) == (400, 0)
    clock.t += 1.5
    assert signals.get(FLEET[1]) is b and (b.prefill_tokens, b.decoding) == (0, 1)
    lifecycle.ended(d)
    assert (b.prefill_tokens, b.uncached_tokens, b.decoding) == (0, 0, 0)


def test_a_signal_blind_policy_builds_plain_candidates_but_explain_sees_the_signals() -> None:
    decider, signals, _, _, _ = rig({FLEET[0]: 600}, policy="loadaware")
    asyncio.run(decider.decide(prompt(1000), "r1"))
    routed = asyncio.run(decider.decide(prompt(1000), "r2"))
    assert all(c.prefill_tokens == 0 and c.uncached_tokens == 0 for c in routed.candidates)
    explained = asyncio.run(decider.decide(prompt(1000), "explain", count=False))
    tracked = {ep: s.uncached_tokens for ep in FLEET if (s := signals.get(ep)) is not None}
    assert sum(tracked.values()) == 1000 + 400  # both requests, each on the engine it was routed to
    assert {c.endpoint: c.uncached_tokens for c in explained.candidates} == {ep: tracked.get(ep, 0) for ep in FLEET}


def test_the_sidecar_feeds_each_scrape_to_the_buffered_estimate() -> None:
    """The wiring (app.py): a scrape the sidecar records reaches the token-signal tracker's TTFT counters."""
    from loadaware.app import Sidecar
    from loadaware.config import from_args

    app = Sidecar(from_args(["--endpoints", FLEET[0], "--metrics-listen", "off"], environ={}))
    app.loads.record(FLEET[0], EngineStats(0, 0, None, 1.0, ttft_sum=0.0, ttft_count=0.0))
    app.loads.record(FLEET[0], EngineStats(0, 0, None, 2.0, ttft_sum=30.0, ttft_count=100.0))
    s = app.signals.get(FLEET[0])
    assert s is not None and s.counters.mean_s == pytest.approx(0.3)


def test_the_prefill_clock_books_each_decision_and_drains_with_time() -> None:
    decider, signals, lifecycle, clock, _ = rig({FLEET[0]: 600}, policy="lane")
    price = TtftPrior().per_token_s
    first = asyncio.run(decider.decide(prompt(1000), "r1"))
    assert first.endpoint == FLEET[0]
    s = signals.get(FLEET[0])
    assert s is not None and s.prefill_clock.free_at == pytest.approx(clock.t + 400 * price)
    second = asyncio.run(decider.decide(prompt(1000), "r2"))
    by_ep = {c.endpoint: c for c in second.candidates}
    assert by_ep[FLEET[0]].lane_wait_s == pytest.approx(400 * price)  # the first one's prefill is ahead
    assert by_ep[FLEET[1]].lane_wait_s == 0.0 and by_ep[FLEET[0]].idle_ttft_base_s is None
    clock.t += 0.05
    third = asyncio.run(decider.decide(prompt(1000), "r3"))
    ahead = (2 if second.endpoint == FLEET[0] else 1) * 400 * price - 0.05
    assert {c.endpoint: c for c in third.candidates}[FLEET[0]].lane_wait_s == pytest.approx(ahead)
    clock.t += 5.0
    idle = asyncio.run(decider.decide(prompt(1000), "r4", count=False))
    assert all(c.lane_wait_s == 0.0 for c in idle.candidates)  # never below now
    for d in (first, second, third):
        lifecycle.ended(d)


def test_the_clock_learns_its_speed_only_from_requests_decided_on_it_idle_and_unqueued() -> None:
    decider, signals, lifecycle, clock, loads = rig({FLEET[0]: 900}, policy="lane")  # FLEET[0] holds a prefix
    for i, n in enumerate((1000, 1600, 1200, 1400)):  # far apart: each finds the clock idle
        clock.t += 10.0
        d = asyncio.run(decider.decide(prompt(n), f"r{i}"))
        assert d.endpoint == FLEET[0]
        clock.t += 0.05 + TtftPrior().per_token_s * (n - 900)  # its own prefill and steps, nothing ahead
        lifecycle.first_chunk(d)
        lifecycle.ended(d)
    s0 = signals.get(FLEET[0])
    assert s0 is not None and s0.prefill_clock.model is not None and s0.prefill_clock.model.observations == 4
    learned = 4
    # Back to back: the second is decided behind the first on the same clock, so it teaches nothing.
    clock.t += 10.0
    one = asyncio.run(decider.decide(prompt(1000), "b1"))
    two = asyncio.run(decider.decide(prompt(1000), "b2"))
    assert one.endpoint == two.endpoint == FLEET[0]
    clock.t += 1.0
    lifecycle.first_chunk(one)
    lifecycle.first_chunk(two)
    assert s0.prefill_clock.model.observations == learned + 1
    # Nor does one decided while the engine showed an admission queue.
    clock.t += 10.0
    loads.record(FLEET[0], EngineStats(running=64, waiting=3, kv_usage=0.9, at=clock.t))
    loads.record(FLEET[1], EngineStats(running=64, waiting=9, kv_usage=0.9, at=clock.t))
    queued = asyncio.run(decider.decide(prompt(1000), "q"))
    assert queued.endpoint == FLEET[0]
    clock.t += 1.0
    lifecycle.first_chunk(queued)
    assert s0.prefill_clock.model.observations == learned + 1
    view = {c.endpoint: c for c in asyncio.run(decider.decide(prompt(10), "v", count=False)).candidates}
    assert view[FLEET[0]].idle_ttft_per_token_s is not None


def test_a_retry_books_its_prefill_on_the_engine_that_served_and_teaches_neither() -> None:
    decider, signals, lifecycle, clock, _ = rig({FLEET[0]: 600}, policy="lane")
    d = asyncio.run(decider.decide(prompt(1000), "r1"))
    assert d.endpoint == FLEET[0]
    lifecycle.served(d, FLEET[1])
    b = signals.get(FLEET[1])
    assert b is not None and b.prefill_clock.free_at == pytest.approx(clock.t + 400 * TtftPrior().per_token_s)
    clock.t += 0.3
    lifecycle.first_chunk(d)
    a = signals.get(FLEET[0])
    assert a is not None and a.prefill_clock.model is None and b.prefill_clock.model is None  # nothing learned


def test_explain_and_metrics_show_the_prefill_clock() -> None:
    from loadaware.api.explain import token_signals
    from loadaware.telemetry.metrics import Metrics

    unlearned = token_signals(Candidate("a", 0, 1.0, lane_wait_s=0.25))
    assert unlearned.prefill_lane_seconds == 0.25 and not unlearned.HasField("idle_ttft_per_token_seconds")
    learned = token_signals(Candidate("a", 0, 1.0, idle_ttft_base_s=0.03, idle_ttft_per_token_s=4e-4,
                                      idle_ttft_per_running_s=0.002))
    assert (learned.idle_ttft_base_seconds, learned.idle_ttft_per_token_seconds,
            learned.idle_ttft_per_running_seconds) == (0.03, 4e-4, 0.002)
    metrics = Metrics("lane")
    metrics.token_signals(FLEET[0], 400, 400, 0, None, 0.125)
    text = metrics.render(dict, (FLEET[0],)).decode()
    assert f'loadaware_endpoint_prefill_lane_seconds{{endpoint="{FLEET[0]}"}} 0.125' in text
    metrics.forget_endpoint(FLEET[0])
    assert "loadaware_endpoint_prefill_lane_seconds{" not in metrics.render(dict, ()).decode()


def test_a_signalled_candidate_carries_each_signal_in_its_own_field() -> None:
    """The candidate is built positionally (pipeline.signalled: keywords cost 1.2 µs a candidate against 0.5):
    every field holds its own signal, every clock field the prefill clock's own value."""
    decider, signals, _, clock, loads = rig({FLEET[0]: 600}, policy="lane")
    s = signals._of(FLEET[0])
    for k in range(12):  # distinct, learned prices
        s.prefill_clock.learn(100 + 30 * k, k % 4, 0.01 + 0.0005 * (100 + 30 * k) + 0.002 * (k % 4))
    s.prefill_clock.book(500, clock.t)
    s.prefill_matched_tokens, s.prefill_tokens, s.uncached_tokens, s.decoding = 7, 11, 13, 3
    loads.record(FLEET[0], EngineStats(running=5, waiting=17, kv_usage=0.25, at=clock.t))
    c = decider.signalled(FLEET[0], 300, 2.0)
    assert (c.lane_wait_s, c.idle_ttft_base_s, c.idle_ttft_per_token_s, c.idle_ttft_per_running_s) == \
        s.prefill_clock.view(clock.t)
    assert c.lane_wait_s > 0 and len({c.idle_ttft_base_s, c.idle_ttft_per_token_s, c.idle_ttft_per_running_s}) == 3
    assert (c.prefill_tokens, c.uncached_tokens, c.prefill_matched_tokens) == (11, 13, 7)
    assert (c.decode_batch, c.waiting, c.kv_usage) == (5, 17, 0.25)  # the scrape's running beats own decoding
    assert (c.endpoint, c.matched_tokens, c.load) == (FLEET[0], 300, 2.0)
    assert (c.cache_demand, c.prefix_routes, c.queued_tokens) == (None, 0.0, 0.0)  # filled later, if read


def test_a_learned_price_stays_within_a_factor_two_of_the_prior() -> None:
    """A source that credits tokens the engine must still load (an LMCache CPU hit) teaches a large base and a
    tiny price per uncached token; bounded, neither runs away."""
    from loadaware.load.prefill_clock import LEARNED_RANGE, PrefillClock

    prior = TtftPrior()
    clock = PrefillClock()
    for k in range(60):  # every first token ~0.4 s whatever the uncached count: load-back time, not prefill
        clock.learn(10 + 100 * (k % 5), 1.0, 0.4)
    _, base, per_token, per_running = clock.view(0.0)
    assert base == pytest.approx(prior.base_s * LEARNED_RANGE)
    assert per_token is not None and prior.per_token_s / LEARNED_RANGE <= per_token <= prior.per_token_s
    assert per_running is not None and per_running <= prior.per_running_s * LEARNED_RANGE
    slow = PrefillClock()
    for k in range(60):  # an engine half as fast as the prior: learned as it is
        slow.learn(200 + 50 * k % 800, 0.0, 2 * (prior.base_s + prior.per_token_s * (200 + 50 * k % 800)))
    _, base, per_token, _ = slow.view(0.0)
    assert per_token is not None and 1.4 * prior.per_token_s < per_token <= 2 * prior.per_token_s  # learned slower


def test_the_sidecar_learns_no_ttft_model_no_policy_of_it_reads() -> None:
    """The TTFT model over every request is the research arm's: a tracker as the sidecar builds it learns only
    the prefill clock's model, from first chunks of requests decided on an idle clock."""
    decider, signals, lifecycle, clock, _ = rig({FLEET[0]: 600}, policy="lane-spread", ttft_model=False)
    d = asyncio.run(decider.decide(prompt(1000), "r1"))
    clock.t += 0.2
    lifecycle.first_chunk(d)
    s = signals.get(d.endpoint or "")
    assert s is not None and s.model is None and s.ttft_s == pytest.approx(0.2)
    assert s.prefill_clock.model is not None and s.prefill_clock.model.observations == 1
    learning = SignalTracker(ttft_model=True)  # what the simulator builds for the research arm
    assert learning.ttft_model and not SignalTracker().ttft_model
