"""The KV-event feeds: subscribe to every engine's vLLM KV-event publisher and keep an exact multi-holder
index (kvevents/query.py answers "matched tokens" from it).

One task per endpoint owns three ZMQ sockets: SUB on the publisher (frames: topic, 8-byte big-endian
sequence, msgpack batch), a monitor of that SUB (connected / disconnected), and, per replay, a fresh DEALER
on the engine's ROUTER replay socket (send the start sequence; batches come back until sequence -1). Each
task handles its feed strictly in order, so the sequence rules in sync.py hold. The hot path
(the query) only reads the in-memory index: no I/O, no awaits.

An endpoint with data-parallel ranks has one feed per rank (ports + rank, `--kv-events-dp-ranks` or
`@RANKS` in the explicit map), and each feed keeps one index part per credited KV-cache group; the
endpoint's credit is the minimum over all its parts (kvevents/groups.py says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from loadaware.fleet.addresses import FeedAddress, host_of, tcp_url
from loadaware.prefix.blocks import BlockIndex
from loadaware.prefix.kvevents.codec import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    EventBatch,
    decode_batch,
    decode_seq,
)
from loadaware.prefix.kvevents.groups import GroupRouter, rank_name
from loadaware.prefix.kvevents.sync import ApplyCounts, FeedSync, Verdict, apply_batch
from loadaware.tasks.supervisor import Supervisor, TaskSpec
from loadaware.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

Spawn = Callable[[TaskSpec], "asyncio.Task[None]"]
FEED_SERIES = "kv-events-feed"  # the restart metric's task label of every engine's feed


def feed_address(endpoint: str, explicit: Mapping[str, FeedAddress], pub_port: int,
                 replay_port: int) -> FeedAddress | None:
    """The explicit entry, else the endpoint's host with the configured ports (None: pub_port 0 = off)."""
    if endpoint in explicit:
        return explicit[endpoint]
    if pub_port <= 0:
        return None
    try:
        host = host_of(endpoint)
    except ValueError:
        return None  # not an address (discovery only registers parsed ones): no feed rather than a crash
    return FeedAddress(tcp_url(host, pub_port), tcp_url(host, replay_port) if replay_port > 0 else None)


@dataclass(frozen=True)
class FeedShared:
    """What every engine's feed of one sidecar shares: the index they fill, the metrics, the ZMQ context and
    the replay time box."""

    index: BlockIndex
    metrics: Metrics
    ctx: zmq.asyncio.Context
    replay_timeout_s: float = 2.0


@dataclass(frozen=True)
class FeedOptions:
    """Where the engines' publishers are: explicit entries, else each endpoint's host with these ports."""

    explicit: Mapping[str, FeedAddress] = field(default_factory=dict)
    pub_port: int = 0  # 0: only the explicit entries are dialled
    replay_port: int = 0  # 0: no replay
    topic: str = ""
    replay_timeout_s: float = 2.0
    dp_ranks: int = 1


class EngineFeed:
    """One engine's feed: subscribe, keep in sequence, replay what was missed, drop the index on restart."""

    def __init__(self, endpoint: str, address: FeedAddress, shared: FeedShared, topic: str, rank: int = 0) -> None:
        self.endpoint = rank_name(endpoint, rank)  # the feed's name: in the index, metrics and logs
        self.rank = rank
        self.router = GroupRouter(self.endpoint)
        self.rank_mismatches = 0
        self.address = address
        self.index = shared.index
        self.metrics = metrics = shared.metrics
        self.ctx = shared.ctx
        self.topic = topic.encode()
        self.replay_timeout_s = shared.replay_timeout_s
        self.sync = FeedSync()
        self.connected = False
        self.synced = False  # connected and caught up once: the index speaks for this engine
        self.last_event_at = 0.0
        self._live = metrics.kv_batches.labels(self.endpoint, "live")
        self._replayed = metrics.kv_batches.labels(self.endpoint, "replay")

    # ---- index changes ----
    def reset(self, reason: str) -> None:
        dropped = self.router.drop(self.index)
        self.sync.reset()
        self.metrics.kv_resets.labels(reason).inc()
        if dropped:
            self.metrics.kv_event_blocks.labels("cleared").inc(dropped)
        log.info("kv-events %s: index dropped (%s, %d blocks)", self.endpoint, reason, dropped)

    def _apply(self, seq: int, batch: EventBatch, live: bool) -> None:
        self.sync.applied(seq, live)
        if batch.data_parallel_rank is not None and batch.data_parallel_rank != self.rank:
            # Another rank's events on this rank's ports: the port map is wrong, and crediting them here
            # could be phantom credit. Counted, logged once, never applied (the numbering still advances).
            self.rank_mismatches += 1
            self.metrics.kv_events.labels("skipped").inc(len(batch.events))
            if self.rank_mismatches == 1:
                log.warning("kv-events %s: batch from data-parallel rank %d on the feed of rank %d; ignored",
                            self.endpoint, batch.data_parallel_rank, self.rank)
            return
        counts = apply_batch(self.index, self.router, batch.events, ApplyCounts())
        self.last_event_at = time.monotonic()
        (self._live if live else self._replayed).inc()
        m = self.metrics
        if live and batch.ts > 0:  # the publisher's wall clock (vLLM: time.time() at the batch)
            m.kv_lag.labels(self.endpoint).set(max(0.0, time.time() - batch.ts))
        for event in batch.events:
            kind = "block_stored" if isinstance(event, BlockStored) else \
                "block_removed" if isinstance(event, BlockRemoved) else "all_blocks_cleared"
            m.kv_events.labels(kind).inc()
            if isinstance(event, AllBlocksCleared):
                m.kv_resets.labels("all_blocks_cleared").inc()
        if batch.skipped:
            m.kv_events.labels("skipped").inc(batch.skipped)
        for op, n in (("stored", counts.stored), ("removed", counts.removed), ("cleared", counts.cleared),
                      ("orphan", counts.orphans), ("evicted", counts.evicted),
                      ("uncredited_group", counts.uncredited)):
            if n:
                m.kv_event_blocks.labels(op).inc(n)

    # ---- the feed ----
    async def run(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.IPV6, 1)  # ZMQ connects to tcp://[v6]:port only with this set (IPv4 still works)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.RECONNECT_IVL, 200)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        # ZMTP heartbeats: a peer that died without closing its connection still counts as vanished.
        sub.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        self.metrics.kv_connected.labels(self.endpoint).set(0)  # a feed that never connects shows (and alerts) too
        sub.connect(self.address.pub)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    await self._on_monitor(parse_monitor_message(await monitor.recv_multipart()))
                if sub in ready:
                    await self.on_message(await sub.recv_multipart())
        finally:
            self.metrics.kv_connected.labels(self.endpoint).set(0)
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _on_monitor(self, event: Mapping[str, object]) -> None:
        kind = event.get("event")
        if kind == zmq.EVENT_CONNECTED:
            self.connected = True
            self.metrics.kv_connected.labels(self.endpoint).set(1)
            if self.sync.last is None:
                await self._replay("join")  # whatever the engine cached before we listened
            self.synced = True
        elif kind == zmq.EVENT_DISCONNECTED:
            # The engine went away (crash, restart, partition): what it held is unknowable until it speaks
            # again, so it earns no credit meanwhile; a reconnect replays from scratch.
            self.connected = False
            self.synced = False
            self.metrics.kv_connected.labels(self.endpoint).set(0)
            self.reset("vanished")

    async def on_message(self, frames: list[bytes]) -> None:
        """One published message (topic, sequence, batch), whoever received it: this feed's own SUB socket, or
        the engines-connect socket (kvevents/inbound.py) that routes an engine's messages here by topic."""
        if len(frames) < 3:
            self.metrics.kv_decode_errors.inc()
            return
        try:
            seq = decode_seq(frames[-2])
            batch = decode_batch(frames[-1])
        except DecodeError as exc:
            self.metrics.kv_decode_errors.inc()
            log.debug("kv-events %s: undecodable message: %s", self.endpoint, exc)
            return
        verdict = self.sync.classify(seq)
        if verdict is Verdict.STALE:
            return
        if verdict is Verdict.RESTART:
            self.reset("sequence_reset")
            verdict = self.sync.classify(seq)
        if verdict is Verdict.GAP:
            self.metrics.kv_gaps.labels(self.endpoint).inc()
            await self._replay("gap", until=seq)
        elif verdict is Verdict.JOIN:
            await self._replay("join", until=seq)
        # After a replay the live batch may be old news, or may still not follow (the replay fell short).
        verdict = self.sync.classify(seq)
        if verdict is Verdict.STALE:
            return
        if verdict is Verdict.GAP:
            self.reset("gap_unrecovered")  # removals may be hidden in the hole: start from this batch
        self._apply(seq, batch, live=True)

    async def _replay(self, reason: str, until: int | None = None) -> None:
        """Ask the replay socket for everything from the next expected number; apply it in order."""
        result = "timeout"
        if self.address.replay is None:
            self.metrics.kv_replays.labels(reason, "unavailable").inc()
            return
        start = self.sync.replay_from
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.IPV6, 1)
        dealer.connect(self.address.replay)
        applied = 0
        try:
            async with asyncio.timeout(self.replay_timeout_s):
                await dealer.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
                while True:
                    frames = await dealer.recv_multipart()
                    seq = decode_seq(frames[-2]) if len(frames) >= 2 else -1
                    if seq < 0:
                        result = "ok"
                        break
                    if until is not None and seq >= until:
                        continue  # the live batch in hand (and later ones) come through the live path
                    verdict = self.sync.accept_replayed(seq)
                    if verdict is Verdict.STALE:
                        continue
                    if verdict is Verdict.GAP:
                        result = "partial"
                        self.reset("gap_unrecovered")
                    self._apply(seq, decode_batch(frames[-1]), live=False)
                    applied += 1
                    if applied % 64 == 0:
                        await asyncio.sleep(0)  # a long replay must not starve the decisions
        except TimeoutError:
            result = "timeout"
        except (DecodeError, zmq.ZMQError) as exc:
            result = "error"
            log.warning("kv-events %s: replay failed: %s", self.endpoint, exc)
        finally:
            dealer.close(linger=0)
        self.metrics.kv_replays.labels(reason, result).inc()
        log.info("kv-events %s: %s replay from %d: %s, %d batches", self.endpoint, reason, start, result, applied)


class KvEventsFeeds:
    """Keeps the feeds of every endpoint of the fleet (one per data-parallel rank): starts feeds for new
    endpoints, stops them and drops their index for endpoints that left."""

    def __init__(self, index: BlockIndex, metrics: Metrics, endpoints: Callable[[], tuple[str, ...]],
                 options: FeedOptions | None = None, spawn: Spawn | None = None) -> None:
        options = options or FeedOptions()
        if options.dp_ranks < 1:
            raise ValueError("dp_ranks must be >= 1")
        # Each feed and the sweeper run supervised (restarted with backoff, counted): the sidecar's supervisor,
        # or a private one where the feeds run alone (tests, tools).
        self.spawn: Spawn = spawn if spawn is not None else Supervisor().spawn
        self.index = index
        self.metrics = metrics
        self.endpoints = endpoints
        self.explicit = dict(options.explicit)
        self.pub_port = options.pub_port
        self.replay_port = options.replay_port
        self.topic = options.topic
        self.replay_timeout_s = options.replay_timeout_s
        self.dp_ranks = tuple(range(options.dp_ranks))
        self.ctx = zmq.asyncio.Context()
        self.shared = FeedShared(index, metrics, self.ctx, options.replay_timeout_s)
        self.feeds: dict[str, list[EngineFeed]] = {}  # endpoint -> one feed per data-parallel rank
        # endpoint -> its parts, for endpoints whose credit is not simply the index entry of their own name
        # (several ranks, several credited groups): what the hot path reads
        self.split: dict[str, tuple[str, ...]] = {}
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._fleet_changed = asyncio.Event()  # the registry's `changed` event: run() syncs the feeds
        # A dropped or cleared engine's keys are unheld in slices between other work (blocks.py, sweep): a
        # 1M-block engine at once would hold the event loop for ~0.35 s.
        self._sweep_wanted = asyncio.Event()
        index.on_retired = self._sweep_wanted.set

    # ---- the registry's events (run() starts and stops the feeds) ----
    def on_added(self, endpoint: str) -> None:
        pass

    def on_removed(self, endpoint: str) -> None:
        pass

    def on_changed(self, endpoints: tuple[str, ...]) -> None:
        self._fleet_changed.set()

    def sync_endpoints(self, endpoints: Sequence[str]) -> None:
        wanted = set(endpoints)
        for endpoint in list(self.feeds):
            if endpoint not in wanted:
                self.remove(endpoint)
        for endpoint in endpoints:
            if endpoint in self.feeds:
                continue
            address = feed_address(endpoint, self.explicit, self.pub_port, self.replay_port)
            if address is None:
                continue
            feeds = [EngineFeed(endpoint, address.for_rank(rank), self.shared, self.topic, rank)
                     for rank in (address.ranks if address.ranks is not None else self.dp_ranks)]
            self.attach(endpoint, feeds)
            self._tasks[endpoint] = [
                self.spawn(TaskSpec(f"kv-events-feed {f.endpoint} {f.address.pub}",
                                    functools.partial(self._run_feed, f), series=FEED_SERIES))
                for f in feeds]

    @staticmethod
    async def _run_feed(feed: EngineFeed) -> None:
        """A feed that crashes starts again on an empty index (the supervisor restarts it with backoff): one
        engine's bad data must not end the rest."""
        try:
            await feed.run()
        except Exception:
            feed.reset("feed_error")
            feed.connected = feed.synced = False
            raise

    def attach(self, endpoint: str, feeds: list[EngineFeed]) -> None:
        """Make `feeds` (one per rank) the endpoint's, without starting them."""
        self.feeds[endpoint] = feeds
        for f in feeds:
            f.router.on_change = lambda ep=endpoint: self._split(ep)
        self._split(endpoint)

    def _split(self, endpoint: str) -> None:
        parts = self.parts(endpoint)
        if parts == (endpoint,) or endpoint not in self.feeds:
            self.split.pop(endpoint, None)
        else:
            self.split[endpoint] = parts

    def remove(self, endpoint: str) -> None:
        feeds = self.feeds.pop(endpoint, None)
        self.split.pop(endpoint, None)
        names = [f.endpoint for f in feeds or ()]
        for task in self._tasks.pop(endpoint, []):
            task.cancel()
            # A cancelled feed marks itself disconnected on its way out: that series goes after it.
            task.add_done_callback(functools.partial(self._series_after, endpoint, names))
        dropped = self.index.drop(endpoint)
        for feed in feeds or ():
            dropped += feed.router.drop(self.index)
        if feeds is not None:
            self.metrics.kv_resets.labels("removed").inc()
            if dropped:
                self.metrics.kv_event_blocks.labels("cleared").inc(dropped)

    def _series_after(self, endpoint: str, names: Sequence[str], _task: asyncio.Task[None]) -> None:
        if endpoint in self.feeds:
            return  # back meanwhile: its new feeds own these series
        for name in names:
            with contextlib.suppress(KeyError):
                self.metrics.kv_connected.remove(name)
            for path in ("live", "replay"):
                with contextlib.suppress(KeyError):
                    self.metrics.kv_batches.remove(name, path)

    def covered(self, endpoints: Sequence[str]) -> set[str]:
        """Endpoints whose feeds (every rank's) are live and caught up: the index speaks for them."""
        return {ep for ep in endpoints
                if (fs := self.feeds.get(ep)) and all(f.connected and f.synced for f in fs)}

    def parts(self, endpoint: str) -> tuple[str, ...]:
        """The index names an endpoint's credit is the minimum over: every credited group of every rank."""
        feeds = self.feeds.get(endpoint)
        if not feeds:
            return (endpoint,)
        if len(feeds) == 1:
            return feeds[0].router.credited_parts()
        return tuple(p for f in feeds for p in f.router.credited_parts())

    def refresh_gauges(self) -> None:
        m = self.metrics
        for endpoint, feeds in list(self.feeds.items()):  # a copy: /metrics renders in a worker thread
            m.kv_index_blocks.labels(endpoint).set(sum(f.router.blocks(self.index) for f in feeds))
        m.kv_index_bytes.set(self.index.approx_bytes())
        m.kv_index_limit.set(self.index.max_blocks)

    def state(self) -> dict[str, object]:
        now = time.monotonic()

        def one(f: EngineFeed) -> dict[str, object]:
            return {"pub": f.address.pub, "replay": f.address.replay, "connected": f.connected,
                    "synced": f.synced, "last_seq": f.sync.last, "blocks": f.router.blocks(self.index),
                    "groups": {str(g): k for g, k in f.router.kinds.items()},
                    "credited_parts": list(f.router.credited_parts()), "rank_mismatches": f.rank_mismatches,
                    "idle_s": round(now - f.last_event_at, 3) if f.last_event_at else None}

        engines: dict[str, object] = {}
        for ep, feeds in list(self.feeds.items()):  # a copy: /debug/state is built in a worker thread
            engines[ep] = one(feeds[0]) if len(feeds) == 1 and feeds[0].rank == 0 else \
                {"ranks": {str(f.rank): one(f) for f in feeds}}
        return {"engines": engines,
                "total_blocks": self.index.total_blocks, "held_keys": self.index.held_keys(),
                "approx_bytes": self.index.approx_bytes(), "max_blocks": self.index.max_blocks,
                "evictions": self.index.evictions}

    async def _sweep(self) -> None:
        while True:
            await self._sweep_wanted.wait()
            self._sweep_wanted.clear()
            while self.index.sweep():
                await asyncio.sleep(0)

    async def run(self) -> None:
        sweeper = self.spawn(TaskSpec("kv-index-sweep", self._sweep))
        try:
            while True:
                self._fleet_changed.clear()
                self.sync_endpoints(self.endpoints())
                await self._fleet_changed.wait()
        finally:
            sweeper.cancel()
            for endpoint in list(self.feeds):
                self.remove(endpoint)
            await asyncio.gather(*(t for ts in self._tasks.values() for t in ts), return_exceptions=True)

    async def close(self) -> None:
        tasks = [t for ts in self._tasks.values() for t in ts]
        for endpoint in list(self.feeds):
            self.remove(endpoint)
        await asyncio.gather(*tasks, return_exceptions=True)
        self.ctx.destroy(linger=0)
