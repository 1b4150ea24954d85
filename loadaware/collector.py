"""A full garbage collection every `--gc-full-interval-s`, then the malloc heap trimmed; timed and counted.

Why: grpc.aio leaves reference cycles behind every RPC (its coroutines and their scopes), which only the cyclic
collector frees. The sidecar raises the young generation's threshold for CPU (cli.py), so an RPC still open
when a young collection runs survives it, is promoted, and its cycles become old-generation garbage; CPython
collects the oldest generation only after 20 middle-generation collections (and only if it grew by a quarter),
which under that threshold took longer than the soak (`make bench BENCH_ARGS="--cases soak"`): no full
collection ran on its own in 200 s at 40 req/s, while the cycles kept piling up. Start-up's objects are frozen
(gc.freeze), so a full collection walks only what the traffic left: 15 ms of CPU on average at 60 req/s,
28 ms with a backlog of open streams (docs/memory.md). The heap trim after it hands freed malloc pages back.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

SLOW_COLLECTION_S = 0.05  # worth a warning: the event loop waited this long


PAGE_BYTES = 4096


def resident_bytes() -> int:
    """This process's resident set size (Linux /proc/self/statm); 0 where there is none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0


def heap_trimmer() -> Callable[[], object] | None:
    """glibc's malloc_trim(0): hands the free pages of the malloc heap back to the system. Objects above 512 B
    (token-id lists, request bodies) and grpc's own buffers live there; freed, their pages stay resident
    until trimmed. None where there is no glibc (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class FullCollections:
    def __init__(self, interval_s: float, registry: CollectorRegistry, trim_heap: bool = True) -> None:
        self.interval_s = interval_s
        self.trim = heap_trimmer() if trim_heap else None
        self.runs = Counter("loadaware_gc_full_collections", "Periodic full garbage collections (--gc-full-interval-s)",
                            registry=registry)
        self.freed = Counter("loadaware_gc_full_collected_objects",
                             "Unreachable objects the periodic full collections freed", registry=registry)
        self.last_s = Gauge("loadaware_gc_full_collection_seconds",
                            "How long the last periodic full collection held the event loop", registry=registry)
        self.max_s = Gauge("loadaware_gc_full_collection_max_seconds",
                           "The longest periodic full collection since start", registry=registry)
        self.cpu_s = Counter("loadaware_gc_full_collection_cpu_seconds",
                             "CPU time the periodic full collections took (the pauses' wall time above includes "
                             "waiting for a busy core)", registry=registry)
        self.trimmed = Counter("loadaware_gc_heap_trimmed_bytes",
                               "Resident bytes handed back to the system by trimming the malloc heap after a "
                               "periodic full collection", registry=registry)
        self.max_pause_s = 0.0

    def collect(self) -> int:
        started, cpu = time.perf_counter(), time.thread_time()
        found = gc.collect()
        if self.trim is not None:
            before = resident_bytes()
            self.trim()
            self.trimmed.inc(max(0, before - resident_bytes()))
        took = time.perf_counter() - started
        self.cpu_s.inc(time.thread_time() - cpu)
        self.runs.inc()
        self.freed.inc(found)
        self.last_s.set(took)
        self.max_pause_s = max(self.max_pause_s, took)
        self.max_s.set(self.max_pause_s)
        if took > SLOW_COLLECTION_S:
            log.warning("a full garbage collection took %.0f ms (%d unreachable objects)", took * 1e3, found)
        return found

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.collect()  # on the loop's thread: a collection holds the GIL wherever it runs
