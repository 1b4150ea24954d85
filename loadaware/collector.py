"""A full garbage collection every `--gc-full-interval-s`, then the malloc heap trimmed; timed and counted.

Why: grpc.aio leaves reference cycles behind every RPC (its coroutines and their scopes), which only the cyclic
collector frees. The sidecar raises the young generation's threshold for CPU (cli.py), so an RPC still open
when a young collection runs survives it, is promoted, and its cycles become old-generation garbage; CPython
collects the oldest generation only after 20 middle-generation collections (and only if it grew by a quarter),
which under that threshold took longer than the soak (`make bench BENCH_ARGS="--cases soak"`): no full
collection ran on its own in 200 s at 40 req/s, while the cycles kept piling up. Start-up's objects are frozen
(gc.freeze), so a full collection walks only what the traffic left (docs/memory.md has the pauses measured).
The heap trim after it hands freed malloc pages back; it runs in a worker thread, off the event loop.

State that comes after start lives long too: per endpoint, the signals, the prefill clock and its TTFT model,
the load tracker's stats (at 10,000 endpoints ~120,000 objects, ~25 ms of every full collection). So a
collection that walked mostly survivors (it took at least FREEZE_AFTER_S of CPU and freed fewer than
FREEZE_BELOW_FREED objects) freezes them (gc.freeze), and the next ones walk only what came after. Freezing
also freezes the cycles of the streams open at that moment, and any cycle in the state that later leaves it,
which the next collections cannot free: so a freeze first thaws what the previous one froze and collects it all
(the start-up objects included), freeing what died frozen since, and comes at most once per FREEZE_EVERY_S,
only when a collection was slow (which after a freeze takes new long-lived state of the same size again).
`loadaware_gc_freezes_total` counts them.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

SLOW_COLLECTION_S = 0.05  # worth a warning: the event loop waited this long
FREEZE_AFTER_S = 0.005  # a full collection's CPU time past which its survivors are frozen ...
FREEZE_BELOW_FREED = 20_000  # ... when it freed fewer objects than this (it walked mostly survivors) ...
FREEZE_EVERY_S = 600.0  # ... and no freeze came within this long (each freezes the open streams' cycles too)


PAGE_BYTES = 4096


def resident_bytes() -> int:
    """This process's resident set size (Linux /proc/self/statm); 0 where there is none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0


def libc_function(name: str, argtypes: list[Any], restype: Any) -> Any | None:
    """The C library's function `name`, typed; None where there is no such library or function (musl, macOS,
    a glibc too old for it)."""
    library = ctypes.util.find_library("c")
    if library is None:
        return None
    try:
        function = getattr(ctypes.CDLL(library), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = argtypes, restype
    return function


def heap_trimmer() -> Callable[[], object] | None:
    """glibc's malloc_trim(0): hands the free pages of the malloc heap back to the system. Objects above 512 B
    (token-id lists, request bodies) and grpc's own buffers live there; freed, their pages stay resident
    until trimmed. None where there is no glibc (musl, macOS)."""
    trim = libc_function("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
    return None if trim is None else lambda: trim(0)


M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def cap_malloc_arenas(arenas: int) -> bool:
    """glibc's mallopt(M_ARENA_MAX, n): at most n malloc arenas, so a new thread shares one instead of getting its
    own. Each arena keeps the pages its threads freed (grpc's and the feeds' threads), and what the heap trim
    cannot hand back stays resident per arena (docs/memory.md). Called before the sidecar starts its threads;
    0 leaves glibc's default (8 per core). False where there is no glibc or it refused."""
    mallopt = libc_function("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int) if arenas > 0 else None
    return mallopt is not None and bool(mallopt(M_ARENA_MAX, arenas))


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def mallinfo2() -> Callable[[], MallInfo2] | None:
    """glibc's mallinfo2 (2.33+), over all arenas; None without it."""
    info: Callable[[], MallInfo2] | None = libc_function("mallinfo2", [], MallInfo2)
    return info


def malloc_counts() -> Callable[[], tuple[int, int]] | None:
    """(bytes handed out and not freed, mmapped chunks included; bytes free inside the heap): live native memory
    apart from what fragmentation keeps resident. None without glibc's mallinfo2."""
    info = mallinfo2()
    if info is None:
        return None

    def counts() -> tuple[int, int]:
        m = info()
        return int(m.uordblks + m.hblkhd), int(m.fordblks)

    return counts


def settled_malloc_reader() -> Callable[[], int] | None:
    """Live malloc bytes after a full collection and a heap trim: what a before/after measurement compares
    (nothing garbage or merely cached by the allocator in it). None without glibc's mallinfo2 and malloc_trim."""
    counts, trim = malloc_counts(), heap_trimmer()
    if counts is None or trim is None:
        return None

    def read() -> int:
        gc.collect()
        trim()
        return counts()[0]

    return read


class FullCollections:
    def __init__(self, interval_s: float, registry: CollectorRegistry, trim_heap: bool = True,
                 freeze_survivors: bool = False) -> None:
        self.interval_s = interval_s
        self.freeze_survivors = freeze_survivors  # the sidecar's: a slow collection's survivors frozen
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
        self.trim_s = Gauge("loadaware_gc_heap_trim_seconds",
                            "How long the last malloc-heap trim took, in a worker thread (the event loop runs "
                            "meanwhile)", registry=registry)
        self.malloc = mallinfo2()
        self.malloc_in_use = Gauge("loadaware_malloc_in_use_bytes",
                                   "Bytes the malloc heap has handed out and not had back (native allocations "
                                   "and Python objects above 512 B), after the last trim", registry=registry)
        # What a growth is made of: malloc's large chunks (each mmapped on its own) apart from its heaps', and
        # Python's objects (its small ones live in arenas Python maps itself, outside malloc's counts).
        self.malloc_mmapped = Gauge("loadaware_malloc_mmapped_bytes",
                                    "Of the bytes in use, those in chunks above malloc's mmap threshold, each "
                                    "mapped on its own (large buffers), after the last trim", registry=registry)
        self.python_blocks = Gauge("loadaware_python_allocated_blocks",
                                   "Blocks Python's allocator has handed out, after the last full collection",
                                   registry=registry)
        self.malloc_free = Gauge("loadaware_malloc_free_bytes",
                                 "Bytes free inside the malloc heap after the last trim (fragmentation)",
                                 registry=registry)
        self.malloc_system = Gauge("loadaware_malloc_system_bytes",
                                   "Bytes malloc's arenas (its main heap and each thread's) hold from the system, "
                                   "live or free, after the last trim; its large mmapped chunks apart",
                                   registry=registry)
        self.freezes = Counter("loadaware_gc_freezes", "Times a slow full collection's survivors were frozen "
                               "out of later collections (long-lived state built after start)", registry=registry)
        self.max_pause_s = 0.0
        self._frozen_at: float | None = None

    def trim_heap(self) -> None:
        """malloc_trim(0), meant for a worker thread: ctypes releases the GIL for the call, so the event loop
        runs meanwhile (it waits only for an allocation from the arena being trimmed at that moment)."""
        if self.trim is not None:
            started, before = time.perf_counter(), resident_bytes()
            self.trim()
            self.trimmed.inc(max(0, before - resident_bytes()))
            self.trim_s.set(time.perf_counter() - started)
        if self.malloc is not None:
            m = self.malloc()
            self.malloc_in_use.set(m.uordblks + m.hblkhd)
            self.malloc_mmapped.set(m.hblkhd)
            self.malloc_free.set(m.fordblks)
            self.malloc_system.set(m.arena)

    def collect(self) -> int:
        """The full collection, on the caller's thread (the event loop's: a collection holds the GIL wherever
        it runs); its pause is what the gauges report."""
        started, cpu = time.perf_counter(), time.thread_time()
        found = gc.collect()
        took = time.perf_counter() - started
        cpu_s = time.thread_time() - cpu
        self.cpu_s.inc(cpu_s)
        if self.freeze_survivors and cpu_s >= FREEZE_AFTER_S and found < FREEZE_BELOW_FREED and (
                self._frozen_at is None or time.monotonic() - self._frozen_at >= FREEZE_EVERY_S):
            found += self.refreeze()
            took = time.perf_counter() - started
        self.python_blocks.set(sys.getallocatedblocks())
        self.runs.inc()
        self.freed.inc(found)
        self.last_s.set(took)
        self.max_pause_s = max(self.max_pause_s, took)
        self.max_s.set(self.max_pause_s)
        if took > SLOW_COLLECTION_S:
            log.warning("a full garbage collection took %.0f ms (%d unreachable objects)", took * 1e3, found)
        return found

    def refreeze(self) -> int:
        """Thaw what earlier freezes kept out of the collector, collect it all, and freeze the survivors: what
        died frozen since (a reference cycle that left the state it was part of, a stream's) is freed here, so a
        freeze keeps from the collector at most what dies within FREEZE_EVERY_S. Returns the objects freed."""
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()  # what survived is long-lived state: later collections leave it be
        self._frozen_at = time.monotonic()
        self.freezes.inc()
        return found

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.collect()
            await asyncio.to_thread(self.trim_heap)
