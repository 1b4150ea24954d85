"""A diagnostic for memory growth: with `--tracemalloc-dir` the sidecar traces its allocations and writes,
every `--tracemalloc-interval-s`, a tracemalloc snapshot and a count of live objects by type (gc).

Comparing two snapshots by traceback (`python -m bench.soak_diff DIR`) names the code that holds what grew.
Tracing costs CPU and memory of its own (every allocation records its frames), so it is off unless asked.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

TRACE_FRAMES = 12  # deep enough to see past asyncio, grpc and the listener plumbing


def object_counts(limit: int = 200) -> dict[str, int]:
    """Live objects tracked by the collector, by type name, the most numerous first."""
    counts = Counter(type(obj).__qualname__ for obj in gc.get_objects())
    return dict(counts.most_common(limit))


def traced_origins(limit: int = 300, samples: int = 3, roots: Iterable[object] | None = None
                   ) -> list[dict[str, object]]:
    """Live objects grouped by (type, where allocated, type of an object referring to it), the largest groups
    first, with a few short reprs each: what a growing traceback actually holds, and who holds it. Objects
    the collector does not track (str, bytes, int, and dicts, lists and tuples of only those) are found as
    referents of those it does, one untracked container deep. `roots`: the holders to start from (default:
    every object the collector tracks)."""
    groups: Counter[tuple[str, str, str]] = Counter()
    shown: dict[tuple[str, str, str], list[str]] = {}
    seen: set[int] = set()

    def visit(obj: object, holder: object | None) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        trace = tracemalloc.get_object_traceback(obj)
        if trace is None:
            return
        frame = trace[-1]  # the most recent call
        if frame.filename.startswith("<frozen"):
            return  # module code and constants, loaded once
        key = (type(obj).__qualname__, f"{frame.filename}:{frame.lineno}",
               "" if holder is None else type(holder).__qualname__)
        groups[key] += 1
        bag = shown.setdefault(key, [])
        if len(bag) < samples:
            bag.append(repr(obj)[:100])

    for holder in gc.get_objects() if roots is None else roots:
        visit(holder, None)
        for obj in gc.get_referents(holder):
            visit(obj, holder)
            if isinstance(obj, (dict, list, tuple)) and not gc.is_tracked(obj):
                for inner in gc.get_referents(obj):
                    visit(inner, obj)
    return [{"type": t, "allocated_at": at, "held_by": by, "count": n, "samples": shown[(t, at, by)]}
            for (t, at, by), n in groups.most_common(limit)]


class MemorySnapshots:
    def __init__(self, directory: str, interval_s: float) -> None:
        self.directory = Path(directory)
        self.interval_s = interval_s
        self.written = 0

    def start_tracing(self) -> None:
        """Called at start, before the servers are built, so their allocations are traced too."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if not tracemalloc.is_tracing():
            tracemalloc.start(TRACE_FRAMES)
        log.warning("tracemalloc on (%d frames): a snapshot every %.0f s in %s; this slows the sidecar",
                    TRACE_FRAMES, self.interval_s, self.directory)

    def write(self) -> Path:
        """One snapshot (`snap-NNNN.tracemalloc`) and its object counts (`snap-NNNN.json`)."""
        stem = self.directory / f"snap-{self.written:04d}"
        # What the collector had not freed yet is not a leak: collect first, and record how much that was.
        stats_before = gc.get_stats()
        traced_before = tracemalloc.get_traced_memory()[0]
        unreachable = gc.collect()
        traced, peak = tracemalloc.get_traced_memory()
        tracemalloc.take_snapshot().dump(f"{stem}.tracemalloc")
        meta = {"index": self.written, "unix_time": time.time(), "traced_bytes": traced, "traced_peak_bytes": peak,
                "garbage": {"unreachable_objects": unreachable, "freed_bytes": traced_before - traced,
                            "collections_before": [g["collections"] for g in stats_before]},
                "objects": object_counts(), "origins": traced_origins()}
        stem.with_suffix(".json").write_text(json.dumps(meta))
        self.written += 1
        return stem

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            # Off the event loop's thread; the snapshot still holds the GIL while it copies the traces.
            await asyncio.to_thread(self.write)
