"""A full garbage collection every `--gc-full-interval-s`, timed and counted.

Why: grpc.aio leaves reference cycles behind every RPC (its coroutines and their scopes), which only the cyclic
collector frees. The sidecar raises the young generation's threshold for CPU (cli.py), so an RPC still open
when a young collection runs survives it, is promoted, and its cycles become old-generation garbage; CPython
collects the oldest generation only after 20 middle-generation collections (and only if it grew by a quarter),
which under that threshold can take hours. Measured in the soak (`make bench BENCH_ARGS="--cases soak"`): the
resident size then grows for as long as the load lasts, ~1 MB a minute at 120 req/s. Start-up's objects are
frozen (gc.freeze), so a full collection walks only what the traffic left: ~1-3 ms, once every interval.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

SLOW_COLLECTION_S = 0.05  # worth a warning: the event loop waited this long


class FullCollections:
    def __init__(self, interval_s: float, registry: CollectorRegistry) -> None:
        self.interval_s = interval_s
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
        self.max_pause_s = 0.0

    def collect(self) -> int:
        started, cpu = time.perf_counter(), time.thread_time()
        found = gc.collect()
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
