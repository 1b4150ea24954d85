"""The exact multi-holder index: chained keys, every holder credited, gaps, media, restarts, memory bound."""

from __future__ import annotations

import gc
import tracemalloc

from loadaware.prefix.blocks import BlockIndex, block_keys, walk
from loadaware.prefix.kvevents.codec import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from loadaware.prefix.kvevents.query import KvEventsPrefixSource
from loadaware.prefix.kvevents.sync import apply_batch
from sim.prefix_cache import PrefixCache, iter_blocks

BS = 16
PROMPT = list(range(1000, 1000 + 10 * BS + 5))  # 10 full blocks and a partial tail
A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


def vhash(engine: str, i: int, salt: int = 0) -> int:
    """Engine-specific hashes: each engine (hash seed) names the same block differently."""
    return hash((engine, i, salt))


def store_chain(index: BlockIndex, engine: str, tokens: list[int], first: int = 0, n: int | None = None,
                medium: str | None = "GPU", as_bytes: bool = False, salt: int = 0) -> None:
    """BlockStored for blocks [first, first+n) of `tokens`, parent = block first-1."""
    n = len(tokens) // BS - first if n is None else n
    conv = (lambda h: h.to_bytes(16, "big", signed=True)) if as_bytes else (lambda h: h)
    hashes = [conv(vhash(engine, i, salt)) for i in range(first, first + n)]
    parent = conv(vhash(engine, first - 1, salt)) if first else None
    index.store(engine, hashes, parent, tokens[first * BS:(first + n) * BS], BS, medium)


def test_chained_keys_are_the_engines_own_prefix_keys() -> None:
    """Same chain rule as the simulated engines' prefix cache: keys depend on tokens only, and chain."""
    keys = block_keys(PROMPT, BS)
    assert len(keys) == 10  # the partial tail has no key
    assert keys == [b.key for b in iter_blocks(PROMPT, BS)]
    assert block_keys(PROMPT[:48], BS) == keys[:3]  # a prefix's keys are a prefix of the keys
    other = PROMPT.copy()
    other[0] += 1
    assert not set(block_keys(other, BS)) & set(keys)  # one token differs: every later key differs
    assert block_keys(tuple(PROMPT), BS) == keys and block_keys(PROMPT, BS, limit=4) == keys[:4]


def test_every_holder_is_credited() -> None:
    index = BlockIndex()
    store_chain(index, A, PROMPT)
    store_chain(index, B, PROMPT, as_bytes=True)  # int and bytes hashes index alike
    store_chain(index, C, PROMPT, n=4)
    keys = block_keys(PROMPT, BS)
    assert index.match(keys, BS, [A, B, C]) == {A: 160, B: 160, C: 64}
    assert index.match(keys, BS, [A]) == {A: 160}  # only endpoints asked about
    assert index.match(block_keys(list(range(500, 600)), BS), BS, [A, B, C]) == {}


def test_credit_stops_at_the_first_missing_block() -> None:
    index = BlockIndex()
    store_chain(index, A, PROMPT)
    store_chain(index, B, PROMPT)
    index.remove(A, [vhash(A, 3)], "GPU")  # A lost block 3: its blocks 4.. are useless for this prompt
    assert index.match(block_keys(PROMPT, BS), BS, [A, B]) == {A: 48, B: 160}
    index.remove(B, [vhash(B, 0)], "GPU")
    assert index.match(block_keys(PROMPT, BS), BS, [A, B]) == {A: 48}


def test_a_stored_continuation_follows_the_parent_chain() -> None:
    index = BlockIndex()
    store_chain(index, A, PROMPT, first=0, n=4)
    store_chain(index, A, PROMPT, first=4, n=6)  # parent = the engine's hash of block 3
    assert index.match(block_keys(PROMPT, BS), BS, [A]) == {A: 160}


def test_orphans_are_not_indexed() -> None:
    index = BlockIndex()
    result = index.store(A, [vhash(A, 5)], vhash(A, 4), PROMPT[5 * BS:6 * BS], BS, "GPU")
    assert result.orphans == 1 and result.stored == 0 and index.blocks(A) == 0


def test_media_are_credited_and_removed_independently() -> None:
    index = BlockIndex()
    store_chain(index, A, PROMPT, medium="GPU")
    store_chain(index, A, PROMPT, medium="CPU")  # offloaded copies of the same blocks
    keys = block_keys(PROMPT, BS)
    assert index.blocks(A) == 10
    index.remove(A, [vhash(A, i) for i in range(10)], "GPU")  # evicted from the GPU, still in CPU memory
    assert index.match(keys, BS, [A]) == {A: 160}
    index.remove(A, [vhash(A, i) for i in range(10)], "CPU")
    assert index.match(keys, BS, [A]) == {} and index.blocks(A) == 0 and index.held_keys() == 0
    store_chain(index, B, PROMPT, medium=None)  # older vLLM: no medium = GPU
    index.remove(B, [vhash(B, 0)], None)
    assert index.match(keys, BS, [B]) == {}


def test_clear_and_drop_only_touch_that_engine() -> None:
    index = BlockIndex()
    for engine in (A, B, C):
        store_chain(index, engine, PROMPT)
    keys = block_keys(PROMPT, BS)
    assert index.clear(A) == 10
    assert index.match(keys, BS, [A, B, C]) == {B: 160, C: 160}
    assert index.drop(B) == 10 and B not in index.engines()
    store_chain(index, "10.0.0.9:8000", PROMPT)  # reuses B's freed slot: no stale bits leak into it
    assert index.match(keys, BS, [A, C, "10.0.0.9:8000"]) == {C: 160, "10.0.0.9:8000": 160}
    assert index.total_blocks == 20


def test_lora_and_multimodal_blocks_earn_no_plain_credit() -> None:
    index = BlockIndex()
    index.store(A, [1, 2], None, PROMPT[:32], BS, "GPU", extra=[("lora", "adapter")] * 2)
    index.store(B, [1, 2], None, PROMPT[:32], BS, "GPU", extra=[None, ("img", 7)])
    assert index.match(block_keys(PROMPT, BS), BS, [A, B]) == {B: 16}


def test_block_size_from_the_events() -> None:
    index = BlockIndex()
    index.store(A, [1, 2], None, PROMPT[:64], 32, "GPU")
    store_chain(index, B, PROMPT)
    source = KvEventsPrefixSource(index)
    assert source.lookup(PROMPT, [A, B]) == {A: 64, B: 160}  # each walked with its own block size
    assert source.lookup(PROMPT[:70], [A, B]) == {A: 64, B: 64}
    assert source.lookup(PROMPT[:40], [A, B]) == {A: 32, B: 32}


def test_apply_batch_in_order_and_all_blocks_cleared() -> None:
    index = BlockIndex()
    events: list[KVEvent] = [
        BlockStored(tuple(vhash(A, i) for i in range(10)), None, tuple(PROMPT[:160]), BS, None, "GPU"),
        BlockRemoved((vhash(A, 9),), "GPU"),
    ]
    counts = apply_batch(index, A, events)
    assert (counts.stored, counts.removed, counts.block_events, counts.events) == (10, 1, 11, 2)
    assert index.match(block_keys(PROMPT, BS), BS, [A]) == {A: 144}
    counts = apply_batch(index, A, [AllBlocksCleared()])
    assert counts.cleared == 9 and index.blocks(A) == 0


def test_index_mirrors_a_simulated_prefix_cache_through_eviction() -> None:
    """Feed the index from a real (simulated) LRU prefix cache under churn: it must equal the cache."""
    from loadaware.prefix.kvevents.codec import decode_batch
    from sim.kv_events_publisher import KvEventsPublisher

    cache = PrefixCache(capacity_blocks=40, block_size=BS)
    pub = KvEventsPublisher("127.0.0.1", 0, None, BS)
    cache.add_observer(pub)
    prompts = [[p * 1000 + t for t in range(64 + (p % 5) * 16)] for p in range(12)]
    for round_ in range(3):
        for p in prompts[round_ * 2:]:
            cache.insert(p)
    index = BlockIndex()
    for _, payload in pub._buffer:
        apply_batch(index, A, decode_batch(payload).events)
    for p in prompts:
        assert index.match(block_keys(p, BS), BS, [A]).get(A, 0) == cache.match(p)
    assert index.blocks(A) == len(cache)


def test_memory_bound_evicts_the_growing_engines_oldest() -> None:
    index = BlockIndex(max_blocks=100)
    store_chain(index, A, list(range(60 * BS)))
    result = index.store(B, [vhash(B, i) for i in range(60)], None, list(range(5000, 5000 + 60 * BS)), BS)
    assert index.total_blocks <= 100 and result.evicted > 0 and index.evictions == result.evicted
    assert index.blocks(A) == 60  # the engine that grew paid
    # what remains of B is its newest blocks: its chain head is gone, so it earns no credit (never phantom)
    assert index.match(block_keys(list(range(5000, 5000 + 60 * BS)), BS), BS, [B]) == {}


def test_the_total_another_thread_reads_never_passes_the_bound_mid_store() -> None:
    """/debug/state reads total_blocks from its render thread while the loop applies events: when the store
    shrinks the index, the one point where the blocks held exceed the bound, the total is still the last settled."""
    index = BlockIndex(max_blocks=100)
    store_chain(index, A, list(range(60 * BS)))
    seen: list[int] = []
    shrink = index._shrink

    def reading(engine: object, excess: int) -> int:
        seen.append(index.total_blocks)
        return shrink(engine, excess)  # type: ignore[arg-type]

    index._shrink = reading  # type: ignore[method-assign]
    result = index.store(B, [vhash(B, i) for i in range(60)], None, list(range(5000, 5000 + 60 * BS)), BS)
    assert seen == [60] and result.evicted > 0 and index.total_blocks == 120 - result.evicted <= 100


def test_memory_estimate_is_honest() -> None:
    """approx_bytes() must be within 30% of what tracemalloc sees, for int and bytes hashes."""
    for as_bytes in (False, True):
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        index = BlockIndex()
        tokens = list(range(200 * BS))
        for e in range(8):
            store_chain(index, f"10.0.1.{e}:8000", tokens, as_bytes=as_bytes)  # 8 holders of the same keys
            store_chain(index, f"10.0.1.{e}:8000", [t + 10**6 * (e + 1) for t in tokens], as_bytes=as_bytes,
                        salt=1)
        used = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        estimate = index.approx_bytes()
        assert index.total_blocks == 3200
        assert used / 1.3 <= estimate <= used * 1.3, (as_bytes, used, estimate)


def test_walk_is_one_pass() -> None:
    holders = {1: 0b11, 2: 0b01, 3: 0b01}
    assert walk(holders, {0: "a", 1: "b"}, 0b11, [1, 2, 3, 4], 16) == {"b": 16, "a": 48}
    assert walk(holders, {0: "a", 1: "b"}, 0, [1], 16) == {}
