"""Prefix cache: chained block keys, prefix match, LRU eviction and observer events."""

from sim.prefix_cache import AllBlocksCleared, BlocksRemoved, BlocksStored, PrefixCache, block_key, iter_blocks


def seq(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_only_full_blocks_match_and_walk_stops_at_first_miss() -> None:
    cache = PrefixCache(capacity_blocks=100, block_size=4)
    stored, evicted = cache.insert(seq(10))  # 2 full blocks, tail of 2 dropped
    assert len(stored) == 2 and evicted == []
    assert cache.match(seq(10)) == 8
    assert cache.match(seq(8) + [99, 98, 97, 96]) == 8
    assert cache.match([99] + seq(11)[1:]) == 0  # first block differs: nothing after it counts
    assert cache.match(seq(3)) == 0


def test_keys_chain_on_parent_so_same_block_in_other_context_misses() -> None:
    cache = PrefixCache(capacity_blocks=100, block_size=4)
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8])
    assert cache.match([9, 9, 9, 9, 5, 6, 7, 8]) == 0
    blocks = iter_blocks([1, 2, 3, 4, 5, 6, 7, 8], 4)
    assert blocks[0].parent is None and blocks[1].parent == blocks[0].key
    assert blocks[1].key == block_key(blocks[0].key, (5, 6, 7, 8))


def test_reinsert_touches_without_storing_again() -> None:
    cache = PrefixCache(capacity_blocks=100, block_size=4)
    cache.insert(seq(8))
    stored, evicted = cache.insert(seq(12))
    assert [b.tokens for b in stored] == [(8, 9, 10, 11)] and evicted == []
    assert len(cache) == 3


def test_lru_evicts_least_recent_sequence_tail_first() -> None:
    cache = PrefixCache(capacity_blocks=4, block_size=4)
    a, b, c = seq(8, 0), seq(8, 100), seq(8, 200)
    cache.insert(a)
    cache.insert(b)
    cache.match(a)  # match is a query: it must not refresh recency
    stored, evicted = cache.insert(c)
    assert len(stored) == 2
    assert [blk.tokens for blk in evicted] == [(4, 5, 6, 7), (0, 1, 2, 3)]  # a's tail, then its head
    assert cache.match(a) == 0 and cache.match(b) == 8 and cache.match(c) == 8
    # Touching b makes a-sized pressure evict c instead.
    cache.insert(b)
    cache.insert(seq(4, 300))
    assert cache.match(b) == 8 and cache.match(c) == 4


def test_prompt_longer_than_capacity_keeps_its_head() -> None:
    cache = PrefixCache(capacity_blocks=2, block_size=4)
    cache.insert(seq(20))
    assert len(cache) == 2 and cache.match(seq(20)) == 8


def test_observer_hears_stored_removed_and_cleared() -> None:
    cache = PrefixCache(capacity_blocks=2, block_size=2)
    events: list[object] = []
    cache.add_observer(events.append)
    cache.insert([1, 2, 3, 4])
    cache.insert([5, 6])
    assert isinstance(events[0], BlocksStored)
    first = events[0].blocks
    assert [b.tokens for b in first] == [(1, 2), (3, 4)] and first[1].parent == first[0].key
    assert isinstance(events[1], BlocksStored) and events[1].blocks[0].parent is None
    assert isinstance(events[2], BlocksRemoved) and events[2].keys == (first[1].key,)
    assert cache.clear() == 2 and isinstance(events[-1], AllBlocksCleared) and len(cache) == 0
