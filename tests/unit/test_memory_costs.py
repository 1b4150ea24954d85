"""The per-unit memory costs in loadaware/memory_budget.py still hold: a real fill of each bounded structure,
measured with tracemalloc, costs no more per unit than the constant says, and not far less (a constant
inflated out of all proportion would hide a real regression behind its slack)."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.memory_per_request import Feed, Mix, Rig, RigOptions
from loadaware import memory_budget as mb
from loadaware.fleet.state_holders import StateHolders
from loadaware.lifecycle import Decision
from loadaware.policies.base import Candidate
from loadaware.prefix.approx import ApproxIndex
from loadaware.prefix.blocks import BlockIndex
from loadaware.prefix.queued import BYTES_PER_QUEUED_BLOCK, QueuedIndex
from loadaware.prefix.working_set import WorkingSet
from loadaware.routing.affinity import SessionAffinity
from loadaware.telemetry.decisions import RING_CANDIDATES, RecentDecisions
from loadaware.telemetry.metrics import Metrics
from loadaware.tokenize.pieces import DOORKEEPER_SLOTS, ChunkedEncoder
from loadaware.tokenize.shared_ids import SharedIds

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
    shared = SharedIds(151_000)  # the tokenizer's table: a fixed cost of its own (memory_budget.py)

    def encode(text: str) -> list[int]:  # ids spread over a 151k vocabulary, ~1 per 5 characters, shared
        return shared([rng.randrange(300, 151_000) for _ in range(max(1, len(text) // 5))])

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


def test_session_affinity_entry() -> None:
    """Session keys as a gateway sends them (a UUID's 36 characters), bound to the registry's endpoint strings."""
    endpoints = [f"10.0.0.{i}:8000" for i in range(8)]
    keep: list[Any] = []
    with traced() as used:
        affinity = SessionAffinity(max_entries=20_000, ttl_s=600.0)
        for i in range(40_000):  # full, and turned over once
            affinity.remember(str(uuid.UUID(int=i)), endpoints[i % 8], i * 1e-3)
        gc.collect()
        cost = used()
        keep.append(affinity)
    assert len(affinity) == 20_000
    check(cost / len(affinity), mb.SESSION_BYTES_PER_ENTRY, "session-affinity entry")


def test_state_holder_entry() -> None:
    """Stored responses' ids as vLLM names them ("resp_" and 32 hex digits), each learned once."""
    endpoints = [f"10.0.0.{i}:8000" for i in range(8)]
    keep: list[Any] = []
    with traced() as used:
        holders = StateHolders(None, max_entries=20_000, ttl_s=86_400.0)
        for i in range(40_000):
            holders.learn(f"resp_{i:032x}", endpoints[i % 8])
        gc.collect()
        cost = used()
        keep.append(holders)
    assert len(holders) == 20_000
    check(cost / len(holders), mb.STATE_HOLDER_BYTES_PER_ENTRY, "stored response's holder")


def test_endpoint_metric_series() -> None:
    """Every metric family labelled by endpoint given one series for each of 2,000 endpoints (the families with
    a second label: one value of it; each more value is one more series)."""
    metrics = Metrics("loadaware")

    def labelnames(collector: Any) -> tuple[str, ...]:  # the tables' (table_series.py), or prometheus_client's
        names: Any = getattr(collector, "labelnames", None) or getattr(collector, "_labelnames", ())
        return tuple(names)

    families: list[Any] = [c for c in list(metrics.registry._collector_to_names) if "endpoint" in labelnames(c)]
    assert len(families) >= 10
    endpoints = [f"10.0.{i // 256}.{i % 256}:8000" for i in range(2_000)]  # the registry's strings
    with traced() as used:
        for ep in endpoints:
            for family in families:
                child = family.labels(*(ep if n == "endpoint" else "x" for n in labelnames(family)))
                (child.inc if hasattr(child, "inc") else child.set)(1)
        gc.collect()
        cost = used()
    per_series = cost / len(endpoints) / len(families)
    print(f"{len(families)} families labelled by endpoint, {per_series:.0f} B a series")
    check(per_series, mb.METRIC_SERIES_BYTES, "per-endpoint metric series")


async def test_open_stream() -> None:
    """One ext_proc stream open after its decision, its handler waiting for the next message (BUFFERED, the
    response headers not yet come): its state, tasks, decision and lease, Python side (gRPC's own per-call
    memory is native and not counted here)."""
    rig = Rig(RigOptions(policy="leastload", sources="", mix=Mix(short=True, chat=0, duplex=0, reset=0,
                                                                  call_gone=0, session=0)))
    await rig.run(200)  # warm: the metric series, the reply caches
    streams = 500
    # the client's side (its messages, the stand-in context) made before tracing: not the sidecar's cost
    feeds = [Feed(rig.traffic.request(10_000 + i)[0][:2], lambda: None, end_at=2, how="reset")
             for i in range(streams)]  # each waits after its body's reply
    tasks: list[asyncio.Future[None]] = [asyncio.Future()] * streams
    with traced() as used:
        for i, feed in enumerate(feeds):
            tasks[i] = asyncio.ensure_future(rig.app.extproc.process(None, feed))
        await asyncio.gather(*(f.hung for f in feeds))
        gc.collect()
        cost = used()
        assert rig.app.extproc.open_streams == streams
        for feed, task in zip(feeds, tasks):
            feed.reset()
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert rig.in_flight() == 0
    print(f"{cost / streams:.0f} B an open stream")
    check(cost / streams, mb.OPEN_STREAM_BYTES, "open ext_proc stream")
