"""What the sidecar's allocations really hold over time, apart from what glibc keeps: the sidecar under memray.

    python -m research.probes.memray_run FILE [--after 0.5] [--until 1.0] [--top 15]

memray (a profiler, not a dependency of the project: `pip install memray`, or a `--target` folder on
PYTHONPATH) records every allocation and free the process makes, native ones with their C stacks. Two probes
run their sidecar under it: `python -m research.probes.sidecar_stream_leak --memray FILE` and
`python -m bench.soak --memray-dir DIR`. This reads such a file and prints:

- the bytes the process's allocations held (memray's count, every allocator, Python's arenas included) at 30
  points of the run, beside its RSS, and of them those malloc handed out: what the program holds, whatever
  glibc's per-thread caches and free lists keep besides. glibc's mallinfo2 (the sidecar's
  loadaware_malloc_in_use_bytes) counts a chunk a thread's cache keeps as in use; memray counts it freed;
- what the allocations held at `--until` over what they held at `--after` (fractions of the run), by the place
  that allocated it (its allocating frames and the Python code that led there), the places that grew most
  first: a leak shows there with about as many allocations as requests, a bounded structure at its bound
  with none or a few resizes.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testkit.profiled import memray_available

SNAPSHOT_ROWS = 30
NATIVE_SHOWN, PYTHON_SHOWN = 4, 6  # of a stack: the allocating frames, and the Python code that led there


def frames(record: Any, depth: int) -> list[tuple[str, str, int]]:
    try:
        return list(record.hybrid_stack_trace(max_stacks=depth))
    except Exception:  # noqa: BLE001 - a record without native frames has its Python stack still
        return list(record.stack_trace(max_stacks=depth))


def shown(stack: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """The allocating frames (the first NATIVE_SHOWN) and the Python frames that led there (up to PYTHON_SHOWN)."""
    python_frames = [f for f in stack[NATIVE_SHOWN:] if f[1].endswith(".py")]
    return [*stack[:NATIVE_SHOWN], *python_frames[:PYTHON_SHOWN]]


def report(path: Path, after: float, top: int, until: float = 1.0, depth: int = 64) -> None:
    import memray

    MAPPED = {memray.AllocatorType.MMAP}  # Python's arenas among them: outside malloc's counts
    reader = memray.FileReader(str(path))
    snapshots = list(reader.get_memory_snapshots())
    if not snapshots:
        raise SystemExit(f"{path}: no memory snapshots")
    t0 = snapshots[0].time
    step = max(1, len(snapshots) // SNAPSHOT_ROWS)
    rows = [*range(0, len(snapshots), step), len(snapshots) - 1]
    records = list(reader.get_temporal_allocation_records(merge_threads=True))
    # malloc's share (what glibc's mallinfo2 counts, less its caches): every allocator but mmap
    malloc_held = [0] * len(rows)
    for record in records:
        if record.allocator in MAPPED:
            continue
        for interval in record.intervals:
            for i, k in enumerate(rows):
                if interval.allocated_before_snapshot <= k and (
                        interval.deallocated_before_snapshot is None or k < interval.deallocated_before_snapshot):
                    malloc_held[i] += interval.n_bytes
    print("| t (s) | RSS (MiB) | held by allocations (MiB) | of it by malloc (MiB) |\n|---:|---:|---:|---:|")
    for i, k in enumerate(rows):
        snap = snapshots[k]
        print(f"| {(snap.time - t0) / 1e3:.0f} | {snap.rss / 2**20:.1f} | {snap.heap / 2**20:.2f} | "
              f"{malloc_held[i] / 2**20:.2f} |")
    cut, end = (min(len(snapshots) - 1, int(len(snapshots) * f)) for f in (after, until))
    grew: Counter[tuple[tuple[str, str, int], ...]] = Counter()
    grew_count: Counter[tuple[tuple[str, str, int], ...]] = Counter()
    for record in records:
        delta = delta_count = 0
        for interval in record.intervals:
            # live at the end but not at the cut, less live at the cut but not at the end
            at_cut, at_end = (interval.allocated_before_snapshot <= k and (
                interval.deallocated_before_snapshot is None or k < interval.deallocated_before_snapshot)
                for k in (cut, end))
            sign = int(at_end) - int(at_cut)
            delta += sign * interval.n_bytes
            delta_count += sign * interval.n_allocations
        if delta or delta_count:
            key = tuple(shown(frames(record, depth)))
            if all(f[0] == "<unknown>" for f in key):  # native code without symbols: told apart by size only
                size = max((i.n_bytes // max(1, i.n_allocations) for i in record.intervals), default=0)
                key = (*key[:1], ("<unresolved native frames>", f"{size} B an allocation", 0))
            grew[key] += delta
            grew_count[key] += delta_count
    print(f"\nWhat the allocations held at {(snapshots[end].time - t0) / 1e3:.0f} s over what they held at "
          f"{(snapshots[cut].time - t0) / 1e3:.0f} s: "
          f"{sum(grew.values()) / 2**20:+.2f} MiB, {sum(grew_count.values()):+,} allocations; the places that "
          "grew most:")
    for key, size in grew.most_common(top):
        if size <= 0:
            break
        print(f"\n{size / 1024:+.1f} KiB, {grew_count[key]:+,} allocations")
        for function, file, line in key:
            print(f"    {function} {file}:{line}")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m research.probes.memray_run", description=__doc__.splitlines()[0])
    p.add_argument("file", type=Path, help="a memray capture of the sidecar")
    p.add_argument("--after", type=float, default=0.5, help="what the allocations held at this fraction of the run ...")
    p.add_argument("--until", type=float, default=1.0,
                   help="... over what they held at this fraction (before the load ends, to compare like with like)")
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args(argv)
    if not memray_available():
        sys.exit("needs memray: pip install memray")
    report(args.file, args.after, args.top, args.until)


if __name__ == "__main__":
    main()
