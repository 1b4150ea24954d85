"""Whether a burst of short-lived small objects leaves resident memory behind when long-lived ones are made
meanwhile, under Python's own allocator and under glibc's (PYTHONMALLOC=malloc), each in a fresh process.

    python -m research.probes.arena_pinning [--bursts 6] [--requests 150] [--objects 2000] [--cache 20000]

Why: the two-hour soak's resident memory stepped up at its bursts, in anonymous maps that are neither glibc's
thread arenas nor thread stacks (bench/soak.py, anon_parts), while Python's allocated blocks stayed flat
(docs/memory.md, December 7, later). A model of that: an LRU cache of `--cache` entries is refreshed all the time
(what the session map, the stored responses' holders, the decisions ring do); a burst holds `--requests`
requests of `--objects` small objects each (a held request's dicts, strings, frames) while the cache keeps being
refreshed, then lets them go. Python frees a 1 MiB arena only when every object in it is gone; glibc hands back
any free 4 KiB page on malloc_trim. Printed per allocator: RSS before the first burst, after each burst (a full
collection and malloc_trim(0) first, as the sidecar's periodic collection does), and Python's blocks.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import subprocess
import sys
from collections import OrderedDict
from collections.abc import Sequence


def rss_mib() -> float:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def settle() -> None:
    gc.collect()
    name = ctypes.util.find_library("c")
    if name:
        ctypes.CDLL(name).malloc_trim(0)


def run(bursts: int, requests: int, objects: int, cache_size: int) -> dict[str, object]:
    cache: OrderedDict[int, tuple[str, float]] = OrderedDict()
    serial = 0

    def refresh(n: int) -> None:
        nonlocal serial
        for _ in range(n):
            serial += 1
            cache[serial] = (f"session-{serial:032x}", float(serial))
            if len(cache) > cache_size:
                cache.popitem(last=False)

    refresh(cache_size * 3)  # steady state: full, entries replaced
    settle()
    start, after, blocks = round(rss_mib(), 1), [], []
    for b in range(bursts):
        held = []
        for r in range(requests):  # each held request: small dicts, strings and lists, as a parsed request's
            held.append([{"k": f"{b}-{r}-{i}", "v": [i, i + 1]} for i in range(objects // 4)])
            refresh(cache_size // (4 * requests) + 1)  # the long-lived state keeps being refreshed meanwhile
        del held
        refresh(cache_size // 2)  # between bursts
        settle()
        after.append(round(rss_mib(), 1))
        blocks.append(sys.getallocatedblocks())
    return {"start_mib": start, "after_bursts_mib": after, "blocks": blocks}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m research.probes.arena_pinning", description=__doc__.splitlines()[0])
    p.add_argument("--bursts", type=int, default=6)
    p.add_argument("--requests", type=int, default=150)
    p.add_argument("--objects", type=int, default=2000)
    p.add_argument("--cache", type=int, default=20_000)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(run(args.bursts, args.requests, args.objects, args.cache)))
        return 0
    for allocator in ("pymalloc", "malloc"):
        env = {**os.environ, "PYTHONMALLOC": allocator}
        cmd = [sys.executable, "-m", "research.probes.arena_pinning", "--child", "--bursts", str(args.bursts),
               "--requests", str(args.requests), "--objects", str(args.objects), "--cache", str(args.cache)]
        r = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
        print(f"{allocator:9s} RSS {r['start_mib']} MiB before, after each burst {r['after_bursts_mib']} "
              f"(Python's blocks {r['blocks'][0]:,} -> {r['blocks'][-1]:,})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
