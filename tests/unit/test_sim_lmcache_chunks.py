"""LMCache chunk keys (as lmcache 0.5.6's ChunkedTokenDatabase computes them) and the LRU chunk store."""

from sim.lmcache_chunks import LMCACHE_CHUNK_SIZE, NONE_HASH, LMCacheStore, chunk_keys


def test_chunk_keys_chain_from_none_hash_and_skip_partial_tail() -> None:
    tokens = list(range(600))
    keys = chunk_keys(tokens)
    assert LMCACHE_CHUNK_SIZE == 256 and NONE_HASH == 0
    assert len(keys) == 2  # 600 = 2 full chunks + an 88-token tail that gets no key
    k0 = hash((0, tuple(range(256)), ()))
    k1 = hash((k0, tuple(range(256, 512)), ()))
    assert keys == [k0, k1]
    assert chunk_keys(tokens[:255]) == []
    assert chunk_keys(tokens[:512]) == keys


def test_chunk_key_depends_on_whole_prefix() -> None:
    a = list(range(512))
    b = [7] + a[1:]
    assert chunk_keys(a)[1] != chunk_keys(b)[1]


def test_chunk_keys_are_stable_across_processes() -> None:
    import subprocess
    import sys

    code = "from sim.lmcache_chunks import chunk_keys; print(chunk_keys(list(range(300)))[0])"
    out = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PYTHONHASHSEED": seed}).stdout.strip() for seed in ("1", "2")}
    assert out == {str(chunk_keys(list(range(300)))[0])}


def test_store_admits_matches_and_evicts_lru() -> None:
    store = LMCacheStore(capacity_chunks=3, chunk_size=4)
    a, b = list(range(8)), list(range(100, 108))
    admitted, evicted = store.admit(a)
    assert admitted == chunk_keys(a, 4) and evicted == []
    assert store.admit(a) == ([], [])  # already held
    admitted, evicted = store.admit(b)
    assert admitted == chunk_keys(b, 4)
    assert evicted == [chunk_keys(a, 4)[1]]  # a's tail goes first, its head stays usable
    assert store.match(a) == 4 and store.match(b) == 8 and store.match(a + [1, 2, 3]) == 4
    assert set(store.clear()) == set(chunk_keys(b, 4)) | {chunk_keys(a, 4)[0]} and len(store) == 0
