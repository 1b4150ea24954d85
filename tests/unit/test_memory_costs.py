"""The per-unit memory costs in loadaware/memory_budget.py still hold: a real fill of each bounded structure,
measured with tracemalloc, costs no more per unit than the constant says, and not far less (a constant
inflated out of all proportion would hide a real regression behind its slack)."""

from __future__ import annotations

import gc
import os
import random
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from loadaware import memory_budget as mb
from loadaware.lifecycle import Decision
from loadaware.policies.base import Candidate
from loadaware.prefix.approx import ApproxIndex
from loadaware.prefix.blocks import BlockIndex
from loadaware.prefix.queued import BYTES_PER_QUEUED_BLOCK, QueuedIndex
from loadaware.prefix.working_set import WorkingSet
from loadaware.telemetry.decisions import RING_CANDIDATES, RecentDecisions
from loadaware.tokenize.pieces import DOORKEEPER_SLOTS, ChunkedEncoder

BS = 16


@contextmanager
def traced() -> Iterator[Callable[[], int]]:
    """Bytes allocated and still held since entry (what the structure built inside costs)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    try:
        yield lambda: tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def check(per_unit: float, constant: int, what: str) -> None:
    assert 0.5 * constant <= per_unit <= constant, f"{what}: {per_unit:.0f} B per unit vs the constant {constant} B"


def test_kv_index_block() -> None:
    """Distinct chains (no key shared between engines) with 32-byte engine hashes: the worst case per block."""
    keep: list[Any] = []
    with traced() as used:
        index = BlockIndex(max_blocks=10**9)
        start = 0
        for e in range(4):
            for _ in range(125):  # 4 engines x 125 sequences x 64 blocks = 32,000 blocks
                hashes = [os.urandom(32) for _ in range(64)]
                index.store(f"10.0.0.{e}:8000", hashes, None, range(start, start + 64 * BS), BS)
                start += 64 * BS
        gc.collect()
        cost = used()
        keep.append(index)
    check(cost / index.total_blocks, mb.KV_INDEX_BYTES_PER_BLOCK, "KV index block")


def test_approx_index_block() -> None:
    with traced() as used:
        index = ApproxIndex(capacity_blocks=10**9, block_size=BS, ttl_s=300)
        start = 0
        for e in range(4):
            for _ in range(125):
                tokens = tuple(range(start, start + 64 * BS))
                start += 64 * BS
                index.record(f"10.0.0.{e}:8000", index.keys(tokens), 0.0)
        gc.collect()
        cost = used()
    check(cost / index.total_blocks, mb.APPROX_BYTES_PER_BLOCK, "approximate index block")


def test_piece_cache_token() -> None:
    rng = random.Random(1)

    def encode(text: str) -> list[int]:  # ids spread over a 151k vocabulary, ~1 per 5 characters
        return [rng.randrange(300, 151_000) for _ in range(max(1, len(text) // 5))]

    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma"]
    with traced() as used:
        encoder = ChunkedEncoder(encode, max_cached_tokens=10**9)
        while encoder.cached_tokens < 50_000:
            text = " ".join(rng.choice(words) + str(rng.randrange(10**6)) for _ in range(400))
            encoder.encode(text)
            encoder.encode(text)  # a piece is cached on its second sighting
        gc.collect()
        cost = used()
    doorkeeper = 8 * DOORKEEPER_SLOTS  # fixed, allocated at start whatever the cache holds
    check((cost - doorkeeper) / encoder.cached_tokens, mb.PIECE_CACHE_BYTES_PER_TOKEN, "piece cache token")


def decisions(ring: RecentDecisions, endpoints: list[str], n: int) -> None:
    rng = random.Random(2)
    for _ in range(n):
        candidates = tuple(Candidate(e, rng.randrange(2000), rng.randrange(50) + 0.5) for e in endpoints)
        ring.on_decided(Decision(f"{rng.getrandbits(128):032x}", endpoints[0], "routed", (), 1578, candidates,
                                 tuple(rng.random() for _ in endpoints),
                                 {"parse": 1e-5, "tokenize": 2e-4, "lookup": 1e-4, "score": 1e-5}, 1e-3,
                                 ranked=tuple(endpoints[:3])))


def test_recent_decision_and_candidate() -> None:
    costs = {}
    for n_endpoints in (1, RING_CANDIDATES):  # the ring keeps each decision's ranked head, no more
        endpoints = [f"10.0.{i // 256}.{i % 256}:8000" for i in range(n_endpoints)]  # the registry holds these
        with traced() as used:
            ring = RecentDecisions(size=256)
            decisions(ring, endpoints, 512)  # the ring full, and turned over once
            gc.collect()
            costs[n_endpoints] = used() / 256
    per_candidate = (costs[RING_CANDIDATES] - costs[1]) / (RING_CANDIDATES - 1)
    check(per_candidate, mb.RECENT_CANDIDATE_BYTES, "recent decision candidate")
    check(costs[1] - per_candidate, mb.RECENT_DECISION_BYTES, "recent decision")


def test_working_set_entry() -> None:
    """Both LRUs full (sampled keys and prompt heads): random 62-bit keys, as hash() gives."""
    rng = random.Random(3)
    keep: list[Any] = []
    with traced() as used:
        ws = WorkingSet(max_entries=20_000)
        ws.set_capacity(20_000 * ws.stride / ws.window)  # the key LRU's bound: exactly max_entries
        for _ in range(40_000):
            ws.observe([rng.getrandbits(62) for _ in range(6)], 6 * ws.stride)
        gc.collect()
        cost = used()
        keep.append(ws)
    entries = len(ws._lru) + len(ws._heads)
    assert entries == 40_000
    check(cost / entries, mb.WORKING_SET_BYTES_PER_ENTRY, "working-set entry")


def test_queued_prefix_entry() -> None:
    """(engine, key) entries of the queued-prefix index, with the receipts that hold them: random 62-bit keys,
    20 per request (a 1,300-token prompt's every 4th block), 5,000 requests over 8 engines."""
    rng = random.Random(5)
    chains = [[rng.getrandbits(62) for _ in range(20)] for _ in range(5_000)]
    engines = [f"10.0.0.{i}:8000" for i in range(8)]
    keep: list[Any] = []
    with traced() as used:
        index = QueuedIndex(max_blocks=1 << 20)
        keep.append([index.hold(engines[i % 8], keys) for i, keys in enumerate(chains)])
        gc.collect()
        cost = used()
    assert index.total_blocks == 100_000
    check(cost / index.total_blocks, BYTES_PER_QUEUED_BLOCK, "queued-prefix entry")
