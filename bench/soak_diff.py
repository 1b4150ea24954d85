"""What grew between two of the sidecar's tracemalloc snapshots (`--tracemalloc-dir`), by traceback.

    python -m bench.soak_diff DIR [--first N] [--last M] [--top 15] [--trend]

Prints the top allocation sites by size growth (each with its innermost frames in the project, or the
innermost frames at all) and the live-object counts by type that grew the most (gc). By default it compares
the second snapshot (after warm-up) with the last.

Two snapshots taken at random moments of a soak differ by what was in flight at each (a burst, a stream
waiting): --trend reads every snapshot from N to M instead and ranks allocation sites (the innermost frame and
the innermost frame in the project) by the least-squares slope of their live blocks, showing only sites whose
count rose in at least RISING_SHARE of the intervals: what grows steadily, not what a moment held.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tracemalloc
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

IGNORED = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>", "<unknown>",
           tracemalloc.__file__, "*/memory_snapshots.py")


def snapshots(directory: Path) -> list[Path]:
    return sorted(directory.glob("snap-*.tracemalloc"))


def top_growth(first: Path, last: Path, top: int, frames: int = 6) -> list[str]:
    filters = [tracemalloc.Filter(False, pattern) for pattern in IGNORED]
    a = tracemalloc.Snapshot.load(str(first)).filter_traces(filters)
    b = tracemalloc.Snapshot.load(str(last)).filter_traces(filters)
    lines = []
    for stat in b.compare_to(a, "traceback")[:top]:
        lines.append(f"{stat.size_diff / 1024:+10.1f} KiB {stat.count_diff:+8d} blocks "
                     f"(now {stat.size / 1024:.1f} KiB in {stat.count})")
        tb = list(stat.traceback)  # most recent call last
        own = [f for f in tb if "/loadaware/" in f.filename]
        # Where it was allocated (innermost frames, often in a library), then the project's own frames.
        shown = tb[-3:] + [f for f in own[-frames:] if f not in tb[-3:]]
        for frame in shown:
            lines.append(f"      {frame.filename}:{frame.lineno}")
    return lines


def object_growth(first: Path, last: Path, top: int) -> list[str]:
    a = json.loads(first.with_suffix(".json").read_text())
    b = json.loads(last.with_suffix(".json").read_text())
    oa, ob = a["objects"], b["objects"]
    diffs = sorted(((ob.get(k, 0) - oa.get(k, 0), k) for k in set(oa) | set(ob)), reverse=True)
    lines = [f"traced: {a['traced_bytes'] / 2**20:.1f} MiB -> {b['traced_bytes'] / 2**20:.1f} MiB "
             f"over {b['unix_time'] - a['unix_time']:.0f} s"]
    lines += [f"{d:+8d} {k} (now {ob.get(k, 0)})" for d, k in diffs[:top] if d > 0]
    return lines


def origin_growth(first: Path, last: Path, top: int) -> list[str]:
    """Groups of live objects (type, allocation site, holder type) that grew the most, with samples."""
    def load(path: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
        meta = json.loads(path.with_suffix(".json").read_text())
        return {(g["type"], g["allocated_at"], g["held_by"]): g for g in meta.get("origins", [])}

    a, b = load(first), load(last)
    rows = sorted(((int(g["count"]) - int(a.get(k, {}).get("count", 0)), k, g) for k, g in b.items()),
                  key=lambda row: row[0], reverse=True)
    lines = []
    for diff, (type_name, at, held_by), g in rows[:top]:
        if diff > 0:
            lines.append(f"{diff:+8d} {type_name} allocated at {at}, held by {held_by or '-'} (now {g['count']}): "
                         f"{'; '.join(str(x) for x in g['samples'])}"[:300])
    return lines


RISING_SHARE = 0.75


def site_of(traceback: tracemalloc.Traceback) -> str:
    """The innermost frame, and the innermost frame in the project when that is elsewhere."""
    frames = list(traceback)  # most recent call last
    where = f"{frames[-1].filename}:{frames[-1].lineno}"
    own = [f for f in frames if "/loadaware/" in f.filename]
    if own and own[-1] is not frames[-1]:
        where += f" <- {own[-1].filename}:{own[-1].lineno}"
    return where


def site_blocks(path: Path) -> dict[str, int]:
    """Live blocks per allocation site in one snapshot."""
    filters = [tracemalloc.Filter(False, pattern) for pattern in IGNORED]
    counts: dict[str, int] = defaultdict(int)
    for stat in tracemalloc.Snapshot.load(str(path)).filter_traces(filters).statistics("traceback"):
        counts[site_of(stat.traceback)] += stat.count
    return counts


def steady_growth(paths: Sequence[Path], top: int) -> list[str]:
    """Sites whose live blocks rose in at least RISING_SHARE of the intervals, by their slope (blocks an hour)."""
    times = [json.loads(path.with_suffix(".json").read_text())["unix_time"] for path in paths]
    series = [site_blocks(path) for path in paths]
    rows = []
    for site in set().union(*series):
        counts = [snap.get(site, 0) for snap in series]
        rises = sum(b > a for a, b in itertools.pairwise(counts))
        if counts[-1] <= counts[0] or rises < RISING_SHARE * (len(counts) - 1):
            continue
        slope = statistics.linear_regression(times, counts).slope * 3600
        rows.append((slope, site, counts))
    rows.sort(reverse=True)
    lines = [f"{len(paths)} snapshots over {times[-1] - times[0]:.0f} s; sites rising in >= "
             f"{RISING_SHARE:.0%} of the intervals, by blocks an hour"]
    for slope, site, counts in rows[:top]:
        lines += [f"{slope:+9.0f}/h  {site}", f"           {' '.join(str(c) for c in counts)}"]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak_diff", description=__doc__.splitlines()[0])
    p.add_argument("directory", type=Path)
    p.add_argument("--first", type=int, default=1, help="index of the earlier snapshot (default 1)")
    p.add_argument("--last", type=int, default=-1, help="index of the later snapshot (default the last)")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--trend", action="store_true", help="sites that grew steadily over every snapshot from --first")
    args = p.parse_args(argv)
    snaps = snapshots(args.directory)
    if len(snaps) < 2:
        print(f"need two snapshots in {args.directory}, found {len(snaps)}", file=sys.stderr)
        return 1
    if args.trend:
        chosen = snaps[min(args.first, len(snaps) - 2):(None if args.last == -1 else args.last + 1)]
        print("\n".join(steady_growth(chosen, args.top)))
        return 0
    first, last = snaps[min(args.first, len(snaps) - 2)], snaps[args.last]
    print(f"## {first.name} -> {last.name}\n")
    print("\n".join(object_growth(first, last, args.top)))
    print()
    print("\n".join(origin_growth(first, last, args.top)))
    print()
    print("\n".join(top_growth(first, last, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
