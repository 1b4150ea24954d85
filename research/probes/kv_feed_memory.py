"""Live malloc on the KV-events feed path, bisected stage by stage (an in-process experiment, loopback only).

    python -m research.probes.kv_feed_memory
        [--stages recv-sync,recv-nopoll,recv,decode,apply,metrics,replay,query,canary]
        [--seconds 120] [--warmup-s 30] [--rate 3000] [--loop uvloop|asyncio]
        [--shape small|soak] [--fill-s 15 --fill-rate 2000] [--max-blocks N]

Why: in the 30-minute soak the sidecar's live malloc (glibc mallinfo2 uordblks + hblkhd,
loadaware.collector.malloc_counts) grew ~30 B per request with the KV-events source on, and stayed flat with
the approximate source alone. This drives the feed path hard and fits live malloc against batches received.

Each stage runs in a fresh pair of processes, so no stage inherits another's heap:
- a publisher process: `--engines` simulated engines (sim/kv_events_publisher.py over sim/prefix_cache.py, as
  the soak's fleet publishes), each a PUB + ROUTER replay socket on 127.0.0.1, each request one batch (a
  BlockStored of the request's new tail blocks, and once the engine's LRU cache is full a BlockRemoved of as
  many evicted ones), `--rate` batches/s over all engines;
- a subscriber process (the one measured), the sidecar's own feed code built as
  tests/integration/test_kv_events.py's Rig does (KvEventsFeeds over an explicit FeedAddress map,
  feeds.run()), on uvloop with the sidecar's gc settings (cli.settle_heap), and stopped at a stage:
    recv-sync    plain (blocking) zmq SUB sockets and a zmq.Poller, no asyncio: frames received and dropped
    recv-nopoll  zmq.asyncio SUB sockets, `await sub.recv_multipart()` in a loop: no Poller, no monitor
    recv         the feed's own run() (SUB + monitor + zmq.asyncio.Poller, join replay), frames dropped
    decode       + decode_seq / decode_batch (prefix/kvevents/codec.py, msgpack), result dropped
    apply        + FeedSync and apply_batch into the BlockIndex (no metrics)
    metrics      the unmodified EngineFeed (what the sidecar runs)
    replay       + a replay (fresh DEALER on the engine's ROUTER) every `--replay-every` batches of a feed
    query        metrics + the KV-events query as the pipeline asks it (CombinedPrefixSource over the counted
                 KvEventsPrefixSource), `--query-rate` lookups/s on the publisher's prefixes
    canary       metrics + a deliberate malloc(30) per batch, never freed: shows the instrument sees ~48 B/batch
Every `--sample-s` the subscriber runs gc.collect() and malloc_trim(0), then reads mallinfo2, RSS and
sys.getallocatedblocks(); the growth per batch is the least-squares slope over the samples after the warm-up.
Results (JSON per stage and a markdown table) go to `--out-dir` (default /tmp/kvmem).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from loadaware.prefix.kvevents.feeds import EngineFeed

REPO = Path(os.environ.get("KVMEM_REPO", Path(__file__).resolve().parent.parent))
BS = 16
STAGES = ("recv-sync", "recv-nopoll", "recv", "decode", "apply", "metrics", "replay", "query", "canary")
# --shape soak: bench/soak.py's prompts and engines (64 shared ~1,544-token prefixes, a unique ~34-token tail,
# 16,384-block engine caches) and the sidecar's default index bound
SOAK_SHAPE = {"prefixes": 64, "prefix_blocks": 96, "tail_tokens": 34, "capacity": 16_384, "max_blocks": 1_500_000}


def make_prefixes(args: argparse.Namespace, rng: random.Random) -> list[list[int]]:
    """Shared prefixes whose last block is partial (the soak's 1,544 tokens are 96.5 blocks)."""
    n = args.prefix_blocks * BS + BS // 2
    return [[rng.randrange(32_000) for _ in range(n)] for _ in range(args.prefixes)]


# ---------------------------------------------------------------- the publisher process
async def publisher_main(args: argparse.Namespace) -> None:
    from sim.kv_events_publisher import KvEventsPublisher
    from sim.prefix_cache import BlocksRemoved, BlocksStored, CacheEvent, PrefixCache

    counts = {"stored_blocks": 0, "removed_blocks": 0, "requests": 0}

    def count(event: CacheEvent) -> None:
        if isinstance(event, BlocksStored):
            counts["stored_blocks"] += len(event.blocks)
        elif isinstance(event, BlocksRemoved):
            counts["removed_blocks"] += len(event.keys)

    engines = []
    for _ in range(args.engines):
        pub = KvEventsPublisher("127.0.0.1", 0, 0, BS, buffer_steps=args.buffer_steps, hash_format=args.hash)
        pub.start()
        cache = PrefixCache(args.capacity, BS)
        cache.add_observer(pub)
        cache.add_observer(count)
        engines.append((pub, cache))
    print(json.dumps({"addresses": [{"pub": f"tcp://127.0.0.1:{p.port}", "replay": f"tcp://127.0.0.1:{p.replay_port}"}
                                    for p, _ in engines]}), flush=True)

    # The soak's prompts, scaled down: a shared prefix whose last block is partial (the soak's 1,544 tokens are
    # 96.5 blocks), then a unique tail, so each request stores ~3 new blocks and, the cache full, evicts ~3.
    rng = random.Random(args.seed)
    prefixes = make_prefixes(args, rng)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    credit, last, req = 0.0, time.monotonic(), 0
    fill_until = last + args.fill_s  # a faster start fills the engines' caches (and the index) sooner
    while not stop.is_set():
        await asyncio.sleep(0.005)
        now = time.monotonic()
        credit += (now - last) * (args.fill_rate if now < fill_until else args.rate) / args.engines
        last = now
        n = min(int(credit), 200)
        credit -= int(credit)
        for _ in range(n):
            for pub, cache in engines:
                req += 1
                tail = [1000 + (req * 7919 + j * 104_729 + rng.randrange(1000)) % 31_000
                        for j in range(args.tail_tokens)]
                cache.insert(prefixes[req % len(prefixes)] + tail)
                pub.flush()  # one engine step, one batch (the soak's engines: one request per step)
        counts["requests"] = req
    counts["batches"] = sum(p.published for p, _ in engines)
    counts["replays_served"] = sum(p.replays_served for p, _ in engines)
    print(json.dumps(counts), flush=True)
    for pub, _ in engines:
        await pub.stop()


# ---------------------------------------------------------------- the subscriber process (measured)
class Meter:
    def __init__(self) -> None:
        from loadaware.collector import heap_trimmer, malloc_counts

        self.trim = heap_trimmer()
        self.malloc = malloc_counts()
        self.samples: list[dict[str, Any]] = []
        self.t0 = time.monotonic()

    def sample(self, batches: int, lag_s: float, index: Any = None) -> dict[str, Any]:
        import tracemalloc

        from loadaware.collector import resident_bytes

        gc.collect()
        if self.trim is not None:
            self.trim()
        in_use, free = self.malloc() if self.malloc is not None else (0, 0)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        s = {"t_s": round(time.monotonic() - self.t0, 2), "batches": batches, "malloc_in_use": in_use,
             "malloc_free": free, "rss": resident_bytes(), "py_blocks": sys.getallocatedblocks(),
             "cpu_s": round(ru.ru_utime + ru.ru_stime, 2), "lag_s": round(lag_s, 4)}
        if tracemalloc.is_tracing():
            s["traced"] = tracemalloc.get_traced_memory()[0]
        if index is not None:
            s["index_blocks"] = index.total_blocks
            s["held_keys"] = index.held_keys()
            s["evictions"] = index.evictions
        self.samples.append(s)
        print(f"  t={s['t_s']:6.1f}s batches={batches:8d} malloc={in_use / 2**20:8.3f} MiB "
              f"rss={s['rss'] / 2**20:7.1f} MiB pyblocks={s['py_blocks']:8d} lag={lag_s:.3f}s"
              + (f" index={s['index_blocks']}" if index is not None else ""), file=sys.stderr, flush=True)
        return s


def head_ts(head: bytes) -> float:
    """The batch's ts without decoding it: array layout [ts, events, rank] = 0x93, then a float64 (0xcb)."""
    if len(head) >= 10 and head[0] == 0x93 and head[1] == 0xCB:
        return struct.unpack(">d", head[2:10])[0]
    return 0.0


def sub_options(sub: Any, zmq: Any, topic: bytes = b"") -> None:
    """The options EngineFeed.run sets on its SUB socket."""
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.IPV6, 1)
    sub.setsockopt(zmq.RCVHWM, 100_000)
    sub.setsockopt(zmq.RECONNECT_IVL, 200)
    sub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    sub.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
    sub.setsockopt(zmq.SUBSCRIBE, topic)


def settle() -> None:
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)  # loadaware/cli.py settle_heap


def recv_sync_main(args: argparse.Namespace, addresses: list[dict[str, str]]) -> dict[str, Any]:
    import zmq

    ctx = zmq.Context()
    subs = []
    poller = zmq.Poller()
    for a in addresses:
        sub = ctx.socket(zmq.SUB)
        sub_options(sub, zmq)
        sub.connect(a["pub"])
        poller.register(sub, zmq.POLLIN)
        subs.append(sub)
    settle()
    meter = Meter()
    batches, head = 0, b""
    next_at, end = meter.t0 + args.sample_s, meter.t0 + args.seconds
    while True:
        for sock, _ in poller.poll(50):
            frames = sock.recv_multipart()
            batches += 1
            head = frames[-1][:10]
        now = time.monotonic()
        if now >= next_at:
            meter.sample(batches, max(0.0, time.time() - head_ts(head)) if head else 0.0)
            next_at += args.sample_s
            if now >= end:
                break
    for sub in subs:
        sub.close(linger=0)
    ctx.term()
    return {"samples": meter.samples}


@dataclass(slots=True)
class RecvState:
    """recv-nopoll's counters, shared by its per-socket tasks."""

    batches: int = 0
    head: bytes = b""


class CountedFeed(Protocol):
    """What a cut StageFeed adds to EngineFeed: batches received and the last batch's first bytes."""

    n_batches: int
    head: bytes


async def recv_nopoll_main(args: argparse.Namespace, addresses: list[dict[str, str]]) -> dict[str, Any]:
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    state = RecvState()

    async def one(url: str) -> None:
        sub = ctx.socket(zmq.SUB)
        sub_options(sub, zmq)
        sub.connect(url)
        try:
            while True:
                frames = await sub.recv_multipart()
                state.batches += 1
                state.head = frames[-1][:10]
        finally:
            sub.close(linger=0)

    tasks = [asyncio.create_task(one(a["pub"])) for a in addresses]
    settle()
    meter = Meter()
    for k in range(1, int(args.seconds / args.sample_s) + 1):
        await asyncio.sleep(max(0.0, meter.t0 + k * args.sample_s - time.monotonic()))
        head = state.head
        meter.sample(state.batches, max(0.0, time.time() - head_ts(head)) if head else 0.0)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    ctx.destroy(linger=0)
    return {"samples": meter.samples}


def _libc_malloc(n: int) -> int:
    import ctypes
    import ctypes.util

    global _MALLOC
    if _MALLOC is None:
        _MALLOC = ctypes.CDLL(ctypes.util.find_library("c")).malloc
        _MALLOC.argtypes, _MALLOC.restype = [ctypes.c_size_t], ctypes.c_void_p
    return int(_MALLOC(n) or 0)


_MALLOC: Any = None


def stage_feed_class(stage: str, replay_every: int) -> type[EngineFeed]:
    """EngineFeed cut at `stage` (recv, decode, apply) or with forced replays (replay); metrics: itself."""
    from loadaware.prefix.kvevents import feeds as feeds_mod
    from loadaware.prefix.kvevents.codec import decode_batch, decode_seq
    from loadaware.prefix.kvevents.sync import ApplyCounts, apply_batch

    if stage in ("metrics", "query"):
        return feeds_mod.EngineFeed

    class StageFeed(feeds_mod.EngineFeed):
        n_batches: int
        head: bytes

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.n_batches = 0
            self.head = b""

        async def on_message(self, frames: list[bytes]) -> None:
            self.n_batches += 1
            self.head = frames[-1][:10]
            if stage == "recv":
                return
            if stage == "decode":
                decode_seq(frames[-2])
                decode_batch(frames[-1])
                return
            if stage == "canary":  # the instrument's check: a deliberate 30-byte native leak per batch
                _libc_malloc(30)
            if stage == "replay" and self.n_batches % replay_every == 0 and self.sync.last is not None:
                await self._replay("forced", until=decode_seq(frames[-2]))
            await super().on_message(frames)

        def _apply(self, seq: int, batch: Any, live: bool) -> None:
            if stage in ("recv", "decode"):  # the join replay: not applied either
                self.sync.applied(seq, live)
                return
            if stage == "apply":
                self.sync.applied(seq, live)
                apply_batch(self.index, self.router, batch.events, ApplyCounts())
                return
            super()._apply(seq, batch, live)

    return StageFeed


async def feeds_main(args: argparse.Namespace, addresses: list[dict[str, str]]) -> dict[str, Any]:
    from unittest import mock

    from loadaware.fleet.addresses import FeedAddress
    from loadaware.prefix.blocks import BlockIndex
    from loadaware.prefix.kvevents import feeds as feeds_mod
    from loadaware.telemetry.metrics import Metrics

    cls = stage_feed_class(args.stage, args.replay_every)
    # this process only (never undone): KvEventsFeeds.sync_endpoints builds the stage's feeds
    mock.patch.object(feeds_mod, "EngineFeed", cls).start()
    explicit = {f"127.0.0.1:{8000 + i}": FeedAddress(a["pub"], a["replay"]) for i, a in enumerate(addresses)}
    endpoints = tuple(explicit)
    index = BlockIndex(args.max_blocks)
    metrics = Metrics("loadaware")
    options = feeds_mod.FeedOptions(explicit=explicit, replay_timeout_s=2.0)
    feeds = feeds_mod.KvEventsFeeds(index, metrics, lambda: endpoints, options)
    task = asyncio.create_task(feeds.run())
    settle()

    def batches() -> int:
        if args.stage in ("metrics", "replay", "query"):
            return int(sum((metrics.kv_batches.value(ep, path) or 0)
                           for ep in endpoints for path in ("live", "replay")))
        # the other stages run StageFeeds (stage_feed_class), which count
        return sum(cast(CountedFeed, f).n_batches for fs in feeds.feeds.values() for f in fs)

    def lag() -> float:
        if args.stage in ("metrics", "replay", "query"):
            return max((metrics.kv_lag.value(ep) or 0.0) for ep in endpoints)
        heads = [h for fs in feeds.feeds.values() for f in fs if (h := cast(CountedFeed, f).head)]
        return max((max(0.0, time.time() - head_ts(h)) for h in heads), default=0.0)

    lookups = {"n": 0}
    querier = asyncio.create_task(query_loop(args, index, feeds, metrics, endpoints, lookups)) \
        if args.stage == "query" else None
    meter = Meter()
    for k in range(1, int(args.seconds / args.sample_s) + 1):
        await asyncio.sleep(max(0.0, meter.t0 + k * args.sample_s - time.monotonic()))
        meter.sample(batches(), lag(), index)
        meter.samples[-1]["lookups"] = lookups["n"]
    if querier is not None:
        querier.cancel()
        await asyncio.gather(querier, return_exceptions=True)
    state = feeds.state()
    replays = {f"{m.labels['reason']}/{m.labels['result']}": m.value for fam in metrics.kv_replays.collect()
               for m in fam.samples if m.name.endswith("_total")}
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await feeds.close()
    return {"samples": meter.samples, "replays": replays, "index_final": {k: state[k] for k in
                                                                        ("total_blocks", "held_keys", "evictions")}}


async def query_loop(args: argparse.Namespace, index: Any, feeds: Any, metrics: Any, endpoints: tuple[str, ...],
                     lookups: dict[str, int]) -> None:
    """The KV-events query as the sidecar's pipeline asks it (routing/pipeline.py -> CombinedPrefixSource -> counted
    KvEventsPrefixSource), on the publisher's prefixes with fresh tails, `--query-rate` lookups/s."""
    from loadaware.prefix.combined import CombinedPrefixSource, Member
    from loadaware.prefix.counted import SourceLookups
    from loadaware.prefix.kvevents.query import KvEventsPrefixSource
    from loadaware.prefix.source import PromptTokens

    kv = KvEventsPrefixSource(index, feeds)
    source = CombinedPrefixSource([Member(SourceLookups(metrics.registry).wrap(kv), kv.covered)], None)
    rng = random.Random(args.seed)
    prefixes = make_prefixes(args, rng)
    credit, last = 0.0, time.monotonic()
    while True:
        await asyncio.sleep(0.005)
        now = time.monotonic()
        credit += (now - last) * args.query_rate
        last = now
        n = min(int(credit), 200)
        credit -= int(credit)
        for _ in range(n):
            tail = [rng.randrange(32_000) for _ in range(args.tail_tokens)]
            await source.matches(PromptTokens(prefixes[rng.randrange(len(prefixes))] + tail), endpoints)
            lookups["n"] += 1


def subscriber_main(args: argparse.Namespace) -> None:
    addresses = json.loads(args.addresses)
    if args.tracemalloc:
        import tracemalloc

        tracemalloc.start(1)
    if args.stage == "recv-sync":
        result = recv_sync_main(args, addresses)
    else:
        if args.loop == "uvloop":
            import uvloop

            uvloop.install()
        main = recv_nopoll_main if args.stage == "recv-nopoll" else feeds_main
        result = asyncio.run(main(args, addresses))
    result.update(stage=args.stage, loop=args.loop if args.stage != "recv-sync" else "none",
                  max_blocks=args.max_blocks, replay_every=args.replay_every)
    Path(args.out).write_text(json.dumps(result, indent=1))


# ---------------------------------------------------------------- the orchestrator
def fit(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else float("nan")


def analyse(result: dict[str, Any], warmup_s: float) -> dict[str, Any]:
    pub = result["publisher"]
    per_batch_blocks = (pub["stored_blocks"] + pub["removed_blocks"]) / max(1, pub["batches"])
    after = [s for s in result["samples"] if s["t_s"] >= warmup_s - 1e-6]
    xs = [float(s["batches"]) for s in after]
    out = {"stage": result["stage"], "loop": result["loop"], "max_blocks": result["max_blocks"],
           "samples": len(after), "batches": int(xs[-1] - xs[0]) if xs else 0,
           "rate": (xs[-1] - xs[0]) / (after[-1]["t_s"] - after[0]["t_s"]) if len(after) > 1 else 0.0,
           "blocks_per_batch": per_batch_blocks,
           "malloc_B_per_batch": fit(xs, [float(s["malloc_in_use"]) for s in after]),
           "rss_B_per_batch": fit(xs, [float(s["rss"]) for s in after]),
           "pyblocks_per_1k_batches": fit(xs, [float(s["py_blocks"]) for s in after]) * 1000,
           "malloc_delta_MiB": (after[-1]["malloc_in_use"] - after[0]["malloc_in_use"]) / 2**20 if after else 0.0,
           "max_lag_s": max((s["lag_s"] for s in after), default=0.0),
           "cpu_s": after[-1]["cpu_s"] - after[0]["cpu_s"] if len(after) > 1 else 0.0}
    if after and "traced" in after[0]:
        out["traced_B_per_batch"] = fit(xs, [float(s["traced"]) for s in after])
    if after and "index_blocks" in after[-1]:
        out["index_blocks"] = f"{min(s['index_blocks'] for s in after)}-{max(s['index_blocks'] for s in after)}"
    out["malloc_B_per_block"] = out["malloc_B_per_batch"] / per_batch_blocks if per_batch_blocks else float("nan")
    return out


def run_stage(stage: str, args: argparse.Namespace, tag: str) -> dict[str, Any]:
    me = [sys.executable, str(Path(__file__).resolve())]
    env = {**os.environ, "PYTHONPATH": str(REPO), "KVMEM_REPO": str(REPO)}
    common = ["--seed", str(args.seed)]
    pub = subprocess.Popen([*me, "--role", "publisher", "--engines", str(args.engines), "--rate", str(args.rate),
                            "--fill-s", str(args.fill_s), "--fill-rate", str(args.fill_rate),
                            "--capacity", str(args.capacity), "--buffer-steps", str(args.buffer_steps),
                            "--hash", args.hash, "--prefixes", str(args.prefixes), "--prefix-blocks",
                            str(args.prefix_blocks), "--tail-tokens", str(args.tail_tokens), *common],
                           cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert pub.stdout is not None
        addresses = json.loads(pub.stdout.readline())["addresses"]
        out = Path(args.out_dir) / f"kv_feed_memory-{tag}.json"
        out.unlink(missing_ok=True)
        sub = [*me, "--role", "subscriber", "--stage", stage, "--addresses", json.dumps(addresses), "--out", str(out),
               "--seconds", str(args.seconds), "--sample-s", str(args.sample_s), "--max-blocks", str(args.max_blocks),
               "--replay-every", str(args.replay_every), "--loop", args.loop, "--query-rate", str(args.query_rate),
               "--prefixes", str(args.prefixes), "--prefix-blocks", str(args.prefix_blocks),
               "--tail-tokens", str(args.tail_tokens), *common]
        if args.tracemalloc:
            sub.append("--tracemalloc")
        print(f"== {tag}", file=sys.stderr, flush=True)
        subprocess.run(sub, cwd=REPO, env=env, check=True, timeout=args.seconds + 120)
        pub.send_signal(signal.SIGTERM)
        counts = json.loads(pub.stdout.readline())
        pub.wait(timeout=30)
    finally:
        if pub.poll() is None:
            pub.kill()
    result = json.loads(out.read_text())
    result["publisher"] = counts
    out.write_text(json.dumps(result, indent=1))
    return result


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| stage | loop | max_blocks | batches fitted | batches/s | blocks/batch | live malloc B/batch "
             "| B/block | malloc delta (MiB) | RSS B/batch | pymalloc blocks /1k batches | max lag (s) "
             "| index blocks |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['stage']} | {r['loop']} | {r['max_blocks']} | {r['batches']} | {r['rate']:.0f} "
                     f"| {r['blocks_per_batch']:.2f} | {r['malloc_B_per_batch']:+.2f} | {r['malloc_B_per_block']:+.2f} "
                     f"| {r['malloc_delta_MiB']:+.2f} | {r['rss_B_per_batch']:+.2f} "
                     f"| {r['pyblocks_per_1k_batches']:+.1f} "
                     f"| {r['max_lag_s']:.3f} | {r.get('index_blocks', '-')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=("orchestrate", "publisher", "subscriber"), default="orchestrate")
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--stage", choices=STAGES, default="metrics")
    p.add_argument("--seconds", type=float, default=120.0, help="each stage's run (warm-up included)")
    p.add_argument("--warmup-s", type=float, default=30.0)
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=3000.0, help="batches/s over all engines")
    p.add_argument("--fill-s", type=float, default=0.0, help="publish at --fill-rate for the first seconds")
    p.add_argument("--fill-rate", type=float, default=2000.0)
    p.add_argument("--engines", type=int, default=3)
    p.add_argument("--capacity", type=int, default=2048, help="each simulated engine's prefix cache, in blocks")
    p.add_argument("--max-blocks", type=int, default=8192, help="the sidecar index's bound (BlockIndex max_blocks)")
    p.add_argument("--buffer-steps", type=int, default=1000, help="the publisher's replay buffer, in batches")
    p.add_argument("--replay-every", type=int, default=500, help="replay stage: one replay per this many batches")
    p.add_argument("--hash", choices=("int", "bytes"), default="int")
    p.add_argument("--prefixes", type=int, default=16)
    p.add_argument("--prefix-blocks", type=int, default=24)
    p.add_argument("--tail-tokens", type=int, default=40)
    p.add_argument("--query-rate", type=float, default=120.0, help="query stage: lookups/s")
    p.add_argument("--shape", choices=("small", "soak"), default="small",
                   help="soak: bench/soak.py's prompts, engine caches and the default index bound (overrides "
                        "--prefixes --prefix-blocks --tail-tokens --capacity --max-blocks)")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="the sidecar installs uvloop")
    p.add_argument("--tracemalloc", action="store_true", help="also trace Python allocations (adds malloc noise)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--addresses", default="[]")
    p.add_argument("--out", default="")
    p.add_argument("--out-dir", default="/tmp/kvmem")
    p.add_argument("--tag", default="", help="suffix of the result files")
    args = p.parse_args(argv)
    if args.shape == "soak":
        for k, v in SOAK_SHAPE.items():
            setattr(args, k, v)
    if args.role == "publisher":
        asyncio.run(publisher_main(args))
        return 0
    if args.role == "subscriber":
        subscriber_main(args)
        return 0
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    rows = []
    for stage in [s.strip() for s in args.stages.split(",") if s.strip()]:
        if stage not in STAGES:
            raise SystemExit(f"unknown stage {stage!r}; one of {', '.join(STAGES)}")
        tag = f"{stage}-{args.loop}-{args.shape}-r{args.rate:g}-mb{args.max_blocks}{'-' + args.tag if args.tag else ''}"
        row = analyse(run_stage(stage, args, tag), args.warmup_s)
        rows.append(row)
        print(table([row]), file=sys.stderr, flush=True)
    text = table(rows)
    name = f"kv_feed_memory-table{'-' + args.tag if args.tag else ''}.md"
    (Path(args.out_dir) / name).write_text(text)
    (Path(args.out_dir) / name.replace(".md", ".json")).write_text(json.dumps(rows, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
