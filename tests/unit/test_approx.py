"""The approximate source: guesses from the sidecar's own decisions, LRU-bounded, decaying, and honest."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from loadaware.app import Sidecar
from loadaware.config import from_args
from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import RequestLifecycle
from loadaware.load.tracker import LoadTracker
from loadaware.policies import make_policy
from loadaware.prefix.approx import ApproxIndex, ApproxPrefixSource
from loadaware.prefix.blocks import block_keys
from loadaware.prefix.combined import CombinedPrefixSource, Member
from loadaware.prefix.source import PartlyUnavailable, PrefixUnavailable
from loadaware.prefix.sources.approx import ApproxParts
from loadaware.routing.builder import build_decider
from loadaware.routing.request import InferenceRequest
from loadaware.telemetry.metrics import Metrics
from loadaware.tokenize.text_units import TextUnits

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
P1 = list(range(320))
P2 = list(range(10_000, 10_320))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_routed_prompts_are_credited_to_where_they_went() -> None:
    index = ApproxIndex(capacity_blocks=1000, block_size=16, ttl_s=60)
    index.record(A, index.keys(P1), now=0)
    index.record(B, index.keys(P1[:160]), now=0)
    assert index.match(index.keys(P1 + [1, 2, 3]), [A, B, C]) == {A: 320, B: 160}


def test_lru_bounded_by_kv_capacity_evicts_tails_first() -> None:
    index = ApproxIndex(capacity_blocks=30, block_size=16, ttl_s=60)
    index.record(A, index.keys(P1), now=0)  # 20 blocks
    evicted = index.record(A, index.keys(P2), now=1)  # 20 more: 10 of P1's must go
    assert evicted == 10 and index.blocks(A) == 30 and index.evicted["capacity"] == 10
    assert index.match(index.keys(P1), [A]) == {A: 160}  # its head survived, its tail went
    assert index.match(index.keys(P2), [A]) == {A: 320}


def test_the_sum_over_engines_is_bounded_too() -> None:
    """A large fleet must not multiply the memory bound: past max_blocks the engine that grew pays."""
    index = ApproxIndex(capacity_blocks=1000, block_size=16, ttl_s=60, max_blocks=50)
    index.record(A, index.keys(P1), now=0)  # 20 blocks
    index.record(B, index.keys(P2), now=0)  # 20 more
    evicted = index.record(C, index.keys(P1 + P2), now=1)  # 40 blocks: 30 over the sum
    assert evicted == 30 and index.total_blocks == 50
    assert (index.blocks(A), index.blocks(B), index.blocks(C)) == (20, 20, 10)
    assert index.match(index.keys(P1), [C]) == {C: 160}  # the head survived, as with the per-engine bound
    index.expire(now=100)
    assert index.total_blocks == 0 and index.approx_bytes() == 0


def test_the_total_another_thread_reads_never_passes_the_bound_mid_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """/debug/state reads total_blocks from its render thread while the loop records: at the eviction, the one
    point of a record where the blocks held exceed the bound, the total it can read is still the last settled one."""
    index = ApproxIndex(capacity_blocks=1000, block_size=16, ttl_s=60, max_blocks=50)
    seen: list[int] = []
    evict = index._evict

    def reading(guess: object, count: int) -> int:
        seen.append(index.total_blocks)
        return evict(guess, count)  # type: ignore[arg-type]

    monkeypatch.setattr(index, "_evict", reading)
    index.record(A, index.keys(P1), now=0)
    index.record(B, index.keys(P2), now=0)
    index.record(C, index.keys(P1 + P2), now=1)  # 30 over the sum: evicts
    assert seen == [40] and index.total_blocks == 50


def test_guesses_decay() -> None:
    index = ApproxIndex(capacity_blocks=1000, block_size=16, ttl_s=10)
    index.record(A, index.keys(P1), now=0)
    index.record(B, index.keys(P1), now=8)
    assert index.expire(now=12) == 20  # A's are older than 10 s; B's are not
    assert index.match(index.keys(P1), [A, B]) == {B: 320}
    index.record(B, index.keys(P1[:32]), now=15)  # routed again: its head is fresh again
    index.expire(now=20)
    assert index.match(index.keys(P1), [A, B]) == {B: 32}


def test_drop_frees_the_engine() -> None:
    index = ApproxIndex(capacity_blocks=1000, block_size=16, ttl_s=10)
    index.record(A, index.keys(P1), now=0)
    assert index.drop(A) == 20 and index.match(index.keys(P1), [A]) == {} and index.approx_bytes() == 0


def test_capacity_bounds_a_single_huge_prompt() -> None:
    index = ApproxIndex(capacity_blocks=5, block_size=16, ttl_s=10)
    assert index.keys(list(range(16 * 100))) == block_keys(list(range(80)), 16)


async def test_text_units_share_prefixes() -> None:
    units = TextUnits()
    text = "hello world, a long shared system prompt. question one"  # 55 bytes
    a = await units.encode_prompt(text)
    b = await units.encode_prompt("hello world, a long shared system prompt. question two")
    assert a[:10] == b[:10] and a != b
    assert len(a) == 14  # 13 units of 4 bytes and a 3-byte tail: counts are about tokens, not bytes
    assert await units.encode_prompt("ab") != await units.encode_prompt("ab\0\0")  # a short tail keeps its length
    assert await units.encode_prompt("é" * 8) == await units.encode_prompt("éééééééé")  # UTF-8 bytes, grouped
    sys = {"role": "system", "content": "x" * 300}
    c1 = await units.encode_chat([sys, {"role": "user", "content": "q1"}])
    c2 = await units.encode_chat([sys, {"role": "user", "content": "q2"}])
    assert c1[:75] == c2[:75] and len(c1) < 100


async def test_source_learns_from_the_pipeline_and_counts_its_credit() -> None:
    metrics = Metrics("loadaware")
    clock = Clock()
    source = ApproxPrefixSource(ApproxIndex(1000, 16, 60), metrics, clock)
    registry = EndpointRegistry((A, B, C))
    inflight = LoadTracker(stale_s=5)
    lifecycle = RequestLifecycle()
    lifecycle.subscribe(inflight)
    lifecycle.subscribe(source)  # the source learns from decisions through the lifecycle, as the app wires it
    decider = build_decider(make_policy("loadaware", 1.0), registry, inflight, lifecycle, None, source)
    first = await decider.decide(InferenceRequest("completions", prompt=P1), "r1")
    holder = first.endpoint
    assert holder is not None and all(c.matched_tokens == 0 for c in first.candidates)
    lifecycle.ended(first)  # the first request finished
    again = await decider.decide(InferenceRequest("completions", prompt=P1 + [7, 7]), "r2")
    assert again.endpoint == holder
    assert {c.endpoint: c.matched_tokens for c in again.candidates}[holder] == 320
    assert metrics.approx_credited._value.get() == 320
    explain = await decider.decide(InferenceRequest("completions", prompt=P2), "x", count=False)
    assert source.index.match(source.index.keys(P2), [A, B, C]) == {}  # an uncounted decision is not routed
    assert explain.endpoint is not None


async def test_a_request_served_elsewhere_is_recorded_there_from_its_receipt_not_its_ids() -> None:
    """The decision drops its token ids once announced; the keys it was recorded under come back when a retry
    walks the ranked list to another engine (that engine computed the prompt's blocks too)."""
    source = ApproxPrefixSource(ApproxIndex(1000, 16, 60), Metrics("loadaware"), Clock())
    lifecycle = RequestLifecycle()
    lifecycle.subscribe(LoadTracker(stale_s=5))
    lifecycle.subscribe(source)
    decider = build_decider(make_policy("loadaware", 1.0), EndpointRegistry((A, B, C)), LoadTracker(stale_s=5),
                            lifecycle, None, source)
    decision = await decider.decide(InferenceRequest("completions", prompt=P1), "r1")
    assert decision.tokens is None and decision.approx == source.index.keys(P1)
    other = next(ep for ep in (A, B, C) if ep != decision.endpoint)
    source.on_decided(decision)  # a repeat finds no ids: nothing recorded, the receipt kept
    assert decision.approx == source.index.keys(P1)
    lifecycle.served(decision, other)
    assert source.index.match(source.index.keys(P1), [other]) == {other: 320}
    lifecycle.ended(decision)


class Fixed:
    def __init__(self, name: str, answer: dict[str, int] | None = None, error: str | None = None) -> None:
        self.name = name
        self.answer = answer or {}
        self.error = error

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        if self.error:
            raise PrefixUnavailable(self.error)
        return {ep: n for ep, n in self.answer.items() if ep in endpoints}


async def test_combined_takes_the_best_exact_answer_and_guesses_only_for_uncovered_engines() -> None:
    lm = Fixed("lmcache", {A: 256})
    kv = Fixed("kv-events", {A: 300, B: 300})
    approx = Fixed("approx", {A: 320, B: 320, C: 320})
    combined = CombinedPrefixSource([Member(lm, lambda eps: {A, B}), Member(kv, lambda eps: {A, B})], approx)
    assert combined.name == "lmcache,kv-events,approx"
    assert await combined.matches(P1, (A, B, C)) == {A: 300, B: 300, C: 320}
    lm.error = "lmcache_timeout"
    with pytest.raises(PartlyUnavailable) as lost:  # one failure: the rest answer, and the loss is named
        await combined.matches(P1, (A, B, C))
    assert lost.value.reason == "lmcache_timeout" and lost.value.answer == {A: 300, B: 300, C: 320}
    kv.error = "boom"
    alone = CombinedPrefixSource([Member(lm, lambda eps: set()), Member(kv, lambda eps: set())])
    with pytest.raises(PrefixUnavailable):
        await alone.matches(P1, (A, B, C))


async def test_the_record_adds_the_holders_lmcache_leaves_out_but_never_overrides_kv_events() -> None:
    """LMCache credits each chunk to its first registered holder only: the sidecar's record of where it sent the
    prefix adds the others (the best of both per endpoint); KV events name every holder, so their endpoints keep
    their own answer."""
    lm = Fixed("lmcache", {A: 512})  # A and B both hold the prefix; LMCache names A only
    approx = Fixed("approx", {A: 480, B: 480, C: 96})
    combined = CombinedPrefixSource([Member(lm, lambda eps: set(eps), complete=False)], approx)
    assert await combined.matches(P1, (A, B, C)) == {A: 512, B: 480, C: 96}
    kv = Fixed("kv-events", {A: 512})  # complete: B and C hold nothing as far as the engines say
    with_kv = CombinedPrefixSource([Member(lm, lambda eps: set(eps), complete=False),
                                    Member(kv, lambda eps: set(eps))], approx)
    assert await with_kv.matches(P1, (A, B, C)) == {A: 512}


async def test_a_decision_that_lost_lmcache_names_it_and_still_uses_the_record() -> None:
    lm = Fixed("lmcache", error="lmcache_error")
    approx = Fixed("approx", {B: 320})
    source = CombinedPrefixSource([Member(lm, lambda eps: set(eps), complete=False)], approx)
    tracker = LoadTracker(stale_s=5)
    lifecycle = RequestLifecycle()
    lifecycle.subscribe(tracker)
    decider = build_decider(
        make_policy("loadaware", 1.0), EndpointRegistry((A, B, C)), tracker, lifecycle, None, source)
    d = await decider.decide(InferenceRequest("completions", prompt=list(P1)), "r")
    assert d.reasons == ("lmcache_error",) and d.outcome == "fallback_load_only"  # a helper was lost, and said
    assert d.endpoint == B and {c.endpoint: c.matched_tokens for c in d.candidates}[B] == 320  # the record spoke


def test_flag_selects_the_sources() -> None:
    tokenizer = str(Path(__file__).resolve().parents[2] / "sim" / "assets" / "tiny-model")
    cases = {
        (): ("approx",),
        # LMCache is asked by token ids: without a tokenizer the record alone; with one, the record beside it
        ("--lmcache-url", "http://127.0.0.1:1"): ("approx",),
        ("--lmcache-url", "http://127.0.0.1:1", "--tokenizer", tokenizer): ("lmcache", "approx"),
        ("--lmcache-url", "http://127.0.0.1:1", "--prefix-source", "lmcache"): ("lmcache",),
        ("--prefix-source", "kv-events"): ("kv-events",),
        ("--prefix-source", "approx,kv-events"): ("kv-events", "approx"),
    }
    for flags, expected in cases.items():
        settings = from_args(["--endpoints", A, "--metrics-listen", "off", *flags])
        assert settings.prefix_sources == expected
        app = Sidecar(settings)
        wiring = app.prefixes
        assert wiring.names == expected and wiring.source is not None
        # the approximate index hears of each routed request through the lifecycle, only when in use
        approx = wiring.part("approx", ApproxParts)
        assert (approx is not None and approx.approx in app.lifecycle._listeners) == ("approx" in expected)
        # text bytes stand in for tokens only for the approximate source alone without a tokenizer
        assert isinstance(app.decider.producers.tokenizer, TextUnits) == (expected == ("approx",))
        asyncio.run(app.prefixes.close())  # LMCache's client among them
    from loadaware.config import ConfigError

    with pytest.raises(ConfigError, match="--prefix-source"):
        from_args(["--prefix-source", "lmcache"])
    with pytest.raises(ConfigError, match="--prefix-source"):
        from_args(["--prefix-source", "magic"])
    with pytest.raises(ConfigError, match="--kv-events-endpoints"):
        from_args(["--kv-events-endpoints", "10.0.0.1:8000"])


@pytest.mark.parametrize("leave", ["evicted", "expired", "dropped"])
def test_a_run_that_leaves_the_index_is_freed_without_the_collector(leave: str) -> None:
    """A run out of its engine's list, and a dropped engine's whole list, hold no reference cycle: each is freed
    when the index lets go of it. The sidecar freezes a slow collection's survivors out of later collections
    (loadaware/collector.py), so a run that was a cycle and had been frozen was never freed."""
    import gc

    index = ApproxIndex(capacity_blocks=100_000, block_size=16, ttl_s=60)
    for n in range(300):  # 300 chains, a run each
        index.record(A, index.keys(list(range(n * 1_000, n * 1_000 + 32))), now=0)
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        if leave == "evicted":
            index.record(A, index.keys(list(range(10**6, 10**6 + 16 * 100_000))), now=1)  # the 300 go
        elif leave == "expired":
            assert index.expire(now=1_000) == 600
        else:
            assert index.drop(A) == 600
        freed = frozen - gc.get_freeze_count()  # objects of the frozen generation freed since (refcounts)
        assert freed >= 600  # every run and its list of keys at least (before: no run, each pointed at itself)
    finally:
        gc.unfreeze()
