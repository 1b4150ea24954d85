"""The periodic full collection (collector.py) and the tracemalloc snapshots (telemetry/memory_snapshots.py)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import inspect
import json
import os
import sys
import tracemalloc
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from loadaware.collector import FullCollections, malloc_counts
from loadaware.telemetry import memory_snapshots
from loadaware.telemetry.memory_snapshots import MemorySnapshots, traced_origins


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def make_cycles(n: int) -> None:
    for _ in range(n):
        a, b = Node(), Node()
        a.other, b.other = b, a  # unreachable once this returns: only the cyclic collector frees it


def test_a_full_collection_frees_old_generation_cycles_and_is_counted() -> None:
    registry = CollectorRegistry()
    collections = FullCollections(30.0, registry)
    gc.collect()
    gc.disable()  # nothing but the collection under test may free them
    try:
        make_cycles(500)
        assert sum(isinstance(o, Node) for o in gc.get_objects()) >= 1000
        blocks_with_cycles = sys.getallocatedblocks()
        found = collections.collect()
    finally:
        gc.enable()
    assert found >= 1000 and not any(isinstance(o, Node) for o in gc.get_objects())
    # Python's blocks are read after the collection: the cycles' 1,000 objects are no longer among them
    blocks = registry.get_sample_value("loadaware_python_allocated_blocks")
    assert blocks is not None and 0 < blocks <= blocks_with_cycles - 1000
    assert registry.get_sample_value("loadaware_gc_full_collections_total") == 1
    assert registry.get_sample_value("loadaware_gc_full_collected_objects_total") == found
    pause = registry.get_sample_value("loadaware_gc_full_collection_seconds")
    assert pause is not None and 0 < pause == registry.get_sample_value("loadaware_gc_full_collection_max_seconds")


def test_the_collection_trims_the_malloc_heap() -> None:
    collections = FullCollections(30.0, CollectorRegistry())
    assert collections.trim is not None  # glibc here: malloc_trim is found
    assert FullCollections(30.0, CollectorRegistry(), trim_heap=False).trim is None
    calls: list[int] = []
    collections.trim = lambda: calls.append(1)
    collections.collect()
    assert calls == []  # the collection alone holds the event loop; the trim runs apart (in a worker thread)
    collections.trim_heap()
    collections.trim_heap()
    assert calls == [1, 1]
    assert collections.trim_s._value.get() > 0
    assert collections.malloc_in_use._value.get() > 0  # mallinfo2 read after the trim
    large = bytearray(64 * 2**20)  # above glibc's largest mmap threshold (32 MiB): a chunk mapped on its own
    collections.trim_heap()
    in_use, mmapped = collections.malloc_in_use._value.get(), collections.malloc_mmapped._value.get()
    assert len(large) <= mmapped <= in_use


def test_resident_bytes_is_this_process() -> None:
    from bench.soak import rss_mb
    from loadaware.collector import resident_bytes

    assert abs(resident_bytes() / 2**20 - rss_mb(os.getpid())) < 20


async def test_the_task_collects_every_interval() -> None:
    collections = FullCollections(0.01, CollectorRegistry())
    task = asyncio.create_task(collections.run())
    while collections.runs._value.get() < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert collections.trim_s._value.get() > 0  # the task trimmed the heap after its collections


def test_snapshots_are_written_with_their_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_snapshots, "traced_origins", lambda: [])  # the whole heap: slow; tested below
    snapshots = MemorySnapshots(str(tmp_path / "snaps"), 60.0)
    was_tracing = tracemalloc.is_tracing()
    snapshots.start_tracing()
    try:
        first, second = snapshots.write(), snapshots.write()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    assert first.name == "snap-0000" and second.name == "snap-0001"
    assert Path(f"{first}.tracemalloc").stat().st_size > 0
    meta = json.loads(second.with_suffix(".json").read_text())
    assert meta["index"] == 1 and meta["traced_bytes"] > 0 and meta["objects"]["dict"] > 0
    assert meta["garbage"]["unreachable_objects"] >= 0 and len(meta["garbage"]["collections_before"]) == 3


def test_origins_name_what_holds_the_memory() -> None:
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start(4)
    try:
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        held = {f"key{i}": f"value-{i}" * 3 for i in range(2000)}  # a dict of strings: untracked by gc itself
        origins = traced_origins(limit=50, roots=[[held]])
    finally:
        if not was_tracing:
            tracemalloc.stop()
    here = f"{Path(__file__).name}:{line}"
    strings = [g for g in origins if g["type"] == "str" and str(g["allocated_at"]).endswith(here)]
    # The values, one untracked container deep (a dict of str keys does not list its keys as referents).
    assert sum(int(str(g["count"])) for g in strings) >= len(held)
    assert all(g["held_by"] == "dict" for g in strings) and all(g["samples"] for g in strings)


def test_malloc_counts_see_native_allocations_come_and_go() -> None:
    counts = malloc_counts()
    assert counts is not None  # glibc here
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before, _ = counts()
    blocks = [libc.malloc(1000) for _ in range(2000)]  # 2 MB in small chunks: in the heap, not mmapped
    during, _ = counts()
    for b in blocks:
        libc.free(b)
    after, free_after = counts()
    assert during - before >= 2000 * 1000
    assert after < during - 1_900_000 and free_after > 0


class State:
    """Long-lived state of the kind built after start (an endpoint's signals): tracked, never garbage."""

    def __init__(self) -> None:
        self.values = [0.0, 1.0]


def test_a_slow_collection_of_survivors_freezes_them_once() -> None:
    registry = CollectorRegistry()
    collections = FullCollections(30.0, registry, freeze_survivors=True)
    frozen_before = gc.get_freeze_count()
    kept = [State() for _ in range(200_000)]  # ~400,000 tracked objects: a collection walks them for ms
    try:
        collections.collect()
        assert registry.get_sample_value("loadaware_gc_freezes_total") == 1
        assert gc.get_freeze_count() >= frozen_before + len(kept)
        make_cycles(100)  # garbage made after the freeze is still collected ...
        assert collections.collect() >= 200
        assert registry.get_sample_value("loadaware_gc_freezes_total") == 1  # ... and no second freeze so soon
        assert not FullCollections(30.0, CollectorRegistry()).freeze_survivors  # off unless asked for
    finally:
        gc.unfreeze()  # the rest of the test run collects as before
    del kept


def pair() -> Node:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


def test_a_freeze_frees_what_died_frozen_since_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cycle alive at a freeze and dropped after it is out of every later collection's reach: the next freeze
    thaws and collects first, so it is freed then (a frozen cycle was never freed: the soak's steady growth)."""
    monkeypatch.setattr("loadaware.collector.FREEZE_EVERY_S", 0.0)
    registry = CollectorRegistry()
    collections = FullCollections(30.0, registry, freeze_survivors=True)
    kept = [State() for _ in range(200_000)]  # a slow collection of survivors: each one freezes
    pairs = [pair() for _ in range(500)]
    try:
        collections.collect()
        assert registry.get_sample_value("loadaware_gc_freezes_total") == 1
        pairs.clear()  # 1,000 nodes in cycles, frozen, now unreachable
        kept += [State() for _ in range(200_000)]  # new long-lived state: the next collection is slow again
        assert collections.collect() >= 1_000
        assert registry.get_sample_value("loadaware_gc_freezes_total") == 2
    finally:
        gc.unfreeze()
    del kept
