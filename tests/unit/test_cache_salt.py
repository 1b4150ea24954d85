"""Tenant isolation by vLLM's `cache_salt`: a salted request is credited only by blocks cached under the same
salt, an unsalted one never by salted blocks; LMCache (which cannot tell salts apart) credits salted requests
nothing; the approximate guess is keyed by salt too.

The KV events below are built as current vLLM publishes them (msgspec structs as msgpack maps tagged by
"type"; `extra_keys` one entry per block, the salt in the first block's entry only, omitted when empty).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
import pytest

from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import RequestLifecycle
from loadaware.load.tracker import LoadTracker
from loadaware.policies import make_policy
from loadaware.prefix.approx import ApproxIndex, ApproxPrefixSource
from loadaware.prefix.blocks import BlockIndex, block_keys
from loadaware.prefix.combined import CombinedPrefixSource, Member
from loadaware.prefix.kvevents.codec import BlockStored, decode_batch
from loadaware.prefix.kvevents.query import KvEventsPrefixSource
from loadaware.prefix.kvevents.sync import apply_batch
from loadaware.prefix.lmcache.bridge import InstanceBridge
from loadaware.prefix.lmcache.client import LMCacheClient
from loadaware.prefix.lmcache.source import LMCachePrefixSource
from loadaware.prefix.source import PartlyUnavailable, PrefixUnavailable, PromptTokens, salt_of
from loadaware.routing.builder import build_decider
from loadaware.routing.request import InferenceRequest, parse_body
from loadaware.telemetry.decisions import DecisionMetrics
from loadaware.telemetry.metrics import Metrics
from sim.kv_events_publisher import KvEventsPublisher
from sim.prefix_cache import PrefixCache

BS = 16
A, B, C, D, E = (f"10.0.0.{i}:8000" for i in range(1, 6))
PROMPT = list(range(1000, 1160))  # 10 blocks
SALT_A, SALT_B = "tenant-a-7f3c9e", "tenant-b-02d41a"


# ---- the request ---------------------------------------------------------------------------------------

def test_cache_salt_is_parsed_from_completions_and_chat_bodies() -> None:
    assert parse_body("completions", b'{"prompt": "hi", "cache_salt": "s1"}').cache_salt == "s1"
    chat = parse_body("chat", b'{"messages": [{"role": "user", "content": "hi"}], "cache_salt": "s2"}')
    assert chat.cache_salt == "s2" and chat.has_prompt
    assert parse_body("chat", b'{"messages": "nope", "cache_salt": "s3"}').cache_salt == "s3"
    assert parse_body("completions", b'{"prompt": "hi"}').cache_salt is None
    # vLLM answers 400 for these; they never become a salt here
    for bad in (b'""', b"42", b'["x"]', b"null"):
        assert parse_body("completions", b'{"prompt": "hi", "cache_salt": ' + bad + b"}").cache_salt is None


def test_salted_tokens_carry_their_salt() -> None:
    tokens = PromptTokens([1, 2, 3], SALT_A)
    assert tokens == [1, 2, 3] and salt_of(tokens) == SALT_A
    assert salt_of(tokens, SALT_B) == SALT_B  # an explicit salt wins
    assert salt_of([1, 2, 3]) is None and salt_of([1, 2, 3], "") is None


# ---- KV events as vLLM publishes them ------------------------------------------------------------------

def stored(hashes: Sequence[int], parent: int | None, tokens: Sequence[int], extra_keys: list[Any] | None = None,
           lora_name: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
                             "token_ids": list(tokens), "block_size": BS, "lora_id": 1 if lora_name else None,
                             "medium": "GPU", "lora_name": lora_name}
    if extra_keys is not None:  # msgspec's omit_defaults drops extra_keys=None
        event["extra_keys"] = extra_keys
    return event


def batch(*events: dict[str, Any]) -> bytes:
    return msgpack.packb({"ts": 1.0, "events": list(events), "data_parallel_rank": 0}, use_bin_type=True)


def cache_under(index: BlockIndex, engine: str, base: int, head_keys: list[Any] | None,
                tail_keys: list[Any] | None = None, lora_name: str | None = None) -> None:
    """An engine caches PROMPT in two events, as vLLM does over two scheduler steps: the first four blocks
    (`head_keys`: their extra_keys on the wire, the salt in the first entry), then the other six chained on
    the fourth."""
    first = [base + i for i in range(4)]
    rest = [base + i for i in range(4, 10)]
    decoded = decode_batch(batch(stored(first, None, PROMPT[:64], head_keys, lora_name),
                                 stored(rest, first[-1], PROMPT[64:], tail_keys, lora_name)))
    assert decoded.skipped == 0
    apply_batch(index, engine, decoded.events)


def salted(salt: str) -> list[Any]:
    return [[salt], None, None, None]


def test_decoded_salted_event_keeps_the_salt_on_the_first_block_only() -> None:
    event = decode_batch(batch(stored([1, 2], None, PROMPT[:32], [[SALT_A], None]))).events[0]
    assert isinstance(event, BlockStored) and event.extra() == ((SALT_A,), None)


@pytest.fixture
def salted_fleet() -> KvEventsPrefixSource:
    index = BlockIndex()
    cache_under(index, A, 100, salted(SALT_A))
    cache_under(index, B, 200, salted(SALT_B))
    cache_under(index, C, 300, None)  # unsalted
    # a salted LoRA request: (lora name, salt) in block 0, the lora name in every later block
    cache_under(index, D, 400, [["adapter", SALT_A], ["adapter"], ["adapter"], ["adapter"]], [["adapter"]] * 6,
                lora_name="adapter")
    # an image in block 0, then the salt (vLLM's order: LoRA, multimodal, salt, prompt embeddings)
    cache_under(index, E, 500, [[["img-uuid", 5], SALT_A], None, None, None])
    return KvEventsPrefixSource(index)


def test_salted_request_is_credited_only_by_blocks_of_its_own_salt(salted_fleet: KvEventsPrefixSource) -> None:
    fleet = (A, B, C, D, E)
    assert salted_fleet.lookup(PROMPT, fleet, SALT_A) == {A: 160}
    assert salted_fleet.lookup(PROMPT, fleet, SALT_B) == {B: 160}
    assert salted_fleet.lookup(PROMPT, fleet, "tenant-z") == {}
    assert salted_fleet.lookup(PROMPT[:70], fleet, SALT_A) == {A: 64}  # partial tail never matches
    assert salted_fleet.lookup(PromptTokens(PROMPT, SALT_B), fleet) == {B: 160}  # salt carried by the tokens


def test_unsalted_request_is_never_credited_by_salted_blocks(salted_fleet: KvEventsPrefixSource) -> None:
    assert salted_fleet.lookup(PROMPT, (A, B, C, D, E)) == {C: 160}
    assert salted_fleet.lookup(PROMPT, (A, B, C, D, E), "") == {C: 160}  # vLLM ignores an empty salt


async def test_salt_reaches_the_source_through_the_pipeline(salted_fleet: KvEventsPrefixSource) -> None:
    lifecycle = RequestLifecycle()
    loads = LoadTracker(stale_s=5)
    lifecycle.subscribe(loads)
    decider = build_decider(make_policy("loadaware", 1.0), EndpointRegistry((A, B, C)), loads, lifecycle, None,
                      salted_fleet)
    for salt, holder in ((SALT_A, A), (SALT_B, B), (None, C)):
        d = await decider.decide(InferenceRequest("completions", prompt=PROMPT, cache_salt=salt), "r", count=False)
        assert {c.endpoint: c.matched_tokens for c in d.candidates} == {A: 0, B: 0, C: 0, holder: 160}
        assert d.endpoint == holder and salt_of(d.tokens or []) == salt


def test_salted_blocks_sent_before_extra_keys_existed_stay_indistinguishable() -> None:
    """vLLM before `extra_keys` (PR #33304) hashes the salt but does not publish it: such blocks look plain.
    The salted request is still not credited (its keys carry the salt); an unsalted one is, wrongly: the
    known limit of those vLLM versions, which no consumer of their events can see past."""
    index = BlockIndex()
    cache_under(index, A, 100, None)
    source = KvEventsPrefixSource(index)
    assert source.lookup(PROMPT, (A,), SALT_A) == {}
    assert source.lookup(PROMPT, (A,)) == {A: 160}


# ---- LMCache: cannot tell salts apart ------------------------------------------------------------------

class CountingClient(LMCacheClient):
    def __init__(self, layout: dict[str, int]) -> None:
        super().__init__("http://127.0.0.1:9", timeout_s=0.1)
        self.layout = layout
        self.calls = 0

    async def lookup(self, tokens: Sequence[int]) -> dict[str, int]:
        self.calls += 1
        return dict(self.layout)


def lmcache_source(metrics: Metrics) -> tuple[LMCachePrefixSource, CountingClient]:
    client = CountingClient({"engine-a": 256})
    bridge = InstanceBridge({"engine-a": A})
    bridge.set_endpoints((A, B))
    return LMCachePrefixSource(client, bridge, None, metrics), client


async def test_lmcache_gives_salted_requests_no_credit_and_says_so() -> None:
    metrics = Metrics("loadaware")
    source, client = lmcache_source(metrics)
    assert await source.matches(PROMPT * 2, (A, B)) == {A: 256}
    with pytest.raises(PrefixUnavailable) as raised:
        await source.matches(PROMPT * 2, (A, B), SALT_A)
    assert raised.value.reason == "lmcache_salted" and client.calls == 1  # not even asked
    assert metrics.lookups.labels(result="salted")._value.get() == 1
    with pytest.raises(PrefixUnavailable):
        await source.matches(PromptTokens(PROMPT * 2, SALT_A), (A, B))


async def test_lmcache_only_deployment_counts_the_salted_fallback() -> None:
    metrics = Metrics("loadaware")
    source, _ = lmcache_source(metrics)
    lifecycle = RequestLifecycle()
    loads = LoadTracker(stale_s=5)
    for listener in (loads, DecisionMetrics(metrics)):
        lifecycle.subscribe(listener)
    decider = build_decider(make_policy("loadaware", 1.0), EndpointRegistry((A, B)), loads, lifecycle, None, source)
    d = await decider.decide(InferenceRequest("completions", prompt=PROMPT * 2, cache_salt=SALT_A), "r")
    assert d.outcome == "fallback_load_only" and d.reasons == ("lmcache_salted",)
    assert all(c.matched_tokens == 0 for c in d.candidates)
    assert metrics.fallbacks.labels(reason="lmcache_salted")._value.get() == 1


async def test_combined_lmcache_declines_salted_and_the_others_answer(salted_fleet: KvEventsPrefixSource) -> None:
    metrics = Metrics("loadaware")
    lm, _ = lmcache_source(metrics)
    approx = ApproxPrefixSource(ApproxIndex(1000, BS, 60), metrics)
    approx.routed(PromptTokens(PROMPT, SALT_A), B)  # a guess under SALT_A for B
    combined = CombinedPrefixSource([Member(lm, lambda eps: set(eps)),
                                     Member(salted_fleet, lambda eps: {A} & set(eps))], approx)
    # unsalted: LMCache credits A (256 > kv-events' nothing for A); B has no guess under no salt
    assert await combined.matches(PROMPT * 2, (A, B)) == {A: 256}
    # salted: LMCache declines (named: lmcache_salted); kv-events credits A under SALT_A; the guess speaks for B
    # (LMCache covered it, but it names one holder per chunk: the record speaks beside it)
    for salt, answer in ((SALT_A, {A: 160, B: 160}), (SALT_B, {B: 160}), ("tenant-z", {})):
        with pytest.raises(PartlyUnavailable) as declined:
            await combined.matches(PROMPT, (A, B), salt)
        assert declined.value.reason == "lmcache_salted" and declined.value.answer == answer, salt


# ---- the approximate guess -----------------------------------------------------------------------------

def test_approx_guesses_are_keyed_by_salt() -> None:
    index = ApproxIndex(capacity_blocks=1000, block_size=BS, ttl_s=60)
    index.record(A, index.keys(PROMPT, SALT_A), now=0)
    index.record(B, index.keys(PROMPT), now=0)
    assert index.match(index.keys(PROMPT, SALT_A), [A, B]) == {A: 160}
    assert index.match(index.keys(PROMPT, SALT_B), [A, B]) == {}
    assert index.match(index.keys(PROMPT), [A, B]) == {B: 160}
    assert index.keys(PROMPT) == block_keys(PROMPT, BS) != index.keys(PROMPT, SALT_A)
    assert index.keys(PROMPT, SALT_A)[1:] != index.keys(PROMPT)[1:]  # the salt chains through every key


async def test_approx_learns_salted_decisions_under_their_salt() -> None:
    metrics = Metrics("loadaware")
    source = ApproxPrefixSource(ApproxIndex(1000, BS, 60), metrics)
    lifecycle = RequestLifecycle()
    loads = LoadTracker(stale_s=5)
    for listener in (loads, source):
        lifecycle.subscribe(listener)
    decider = build_decider(make_policy("loadaware", 1.0), EndpointRegistry((A, B, C)), loads, lifecycle, None, source)
    first = await decider.decide(InferenceRequest("completions", prompt=PROMPT, cache_salt=SALT_A), "r1")
    holder = first.endpoint
    assert holder is not None
    lifecycle.ended(first)

    async def credit(salt: str | None) -> dict[str, int]:
        d = await decider.decide(InferenceRequest("completions", prompt=PROMPT, cache_salt=salt), "x", count=False)
        return {c.endpoint: c.matched_tokens for c in d.candidates if c.matched_tokens}

    assert await credit(SALT_A) == {holder: 160}
    assert await credit(SALT_B) == {}
    assert await credit(None) == {}
    # a retry served elsewhere: the other engine computed the salted blocks too, under the same salt
    second = await decider.decide(InferenceRequest("completions", prompt=PROMPT, cache_salt=SALT_A), "r2")
    other = next(ep for ep in (A, B, C) if ep != second.endpoint)
    lifecycle.served(second, other)
    assert other in await credit(SALT_A) and other not in await credit(None)


# ---- the simulated engines publish salted blocks as vLLM does -----------------------------------------

@pytest.mark.parametrize("layout", ["array", "map"])
def test_simulated_salted_blocks_decode_to_the_caches_truth(layout: str) -> None:
    pub = KvEventsPublisher("127.0.0.1", 0, None, block_size=BS, layout=layout)
    cache = PrefixCache(capacity_blocks=100, block_size=BS)
    cache.add_observer(pub)
    cache.insert(PROMPT, salt=SALT_A)
    cache.insert(PROMPT[:64])
    cache.insert(PROMPT + list(range(16)), salt=SALT_A)  # one more block, chained on the salted ones
    raw = [msgpack.unpackb(payload) for _, payload in pub._buffer]
    assert all(isinstance(b, dict if layout == "map" else list) for b in raw)
    index = BlockIndex()
    for _, payload in pub._buffer:
        apply_batch(index, A, decode_batch(payload).events)
    source = KvEventsPrefixSource(index)
    for salt in (SALT_A, None, SALT_B):
        tokens = PROMPT + list(range(16))
        assert source.lookup(tokens, (A,), salt).get(A, 0) == cache.match(tokens, salt)
    assert cache.match(PROMPT, SALT_A) == 160 and cache.match(PROMPT) == 64 and cache.match(PROMPT, SALT_B) == 0
