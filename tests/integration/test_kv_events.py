"""The KV-events source against real ZMQ sockets on loopback: simulated engines (and bare publishers over a
real simulated prefix cache) publish; the sidecar's feeds subscribe, replay, and drop what they must."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import Counter

from loadaware.fleet.addresses import FeedAddress, parse_feed_map
from loadaware.prefix.blocks import BlockIndex, block_keys
from loadaware.prefix.kvevents.feeds import FeedOptions, KvEventsFeeds
from loadaware.prefix.kvevents.query import KvEventsPrefixSource
from loadaware.telemetry.metrics import Metrics
from loadaware.telemetry.table_series import TableCounter
from sim.fleet import KvEventsOptions, start_fleet
from sim.kv_events_publisher import KvEventsPublisher
from sim.prefix_cache import PrefixCache, iter_blocks
from sim.tokenization import SimTokenizer
from tests.conftest import wait_until_async

BS = 16


def value(metric: Counter | TableCounter, *labels: str) -> float:
    if isinstance(metric, TableCounter):
        return metric.value(*labels) or 0.0
    child = metric.labels(*labels) if labels else metric
    return float(child._value.get())


class Rig:
    """Bare publishers over real prefix caches, one per fake endpoint, and the sidecar's feeds."""

    def __init__(self, n: int, base: int, replay: bool = True, buffer_steps: int = 10_000,
                 layout: str = "array") -> None:
        self.caches: dict[str, PrefixCache] = {}
        self.pubs: dict[str, KvEventsPublisher] = {}
        self.explicit: dict[str, FeedAddress] = {}
        for i in range(n):
            ip = f"127.0.0.{base + i}"
            endpoint = f"{ip}:8000"
            pub = KvEventsPublisher(ip, 0, 0 if replay else None, BS, buffer_steps=buffer_steps, layout=layout)
            pub.start()
            cache = PrefixCache(capacity_blocks=200, block_size=BS)
            cache.add_observer(pub)
            self.caches[endpoint], self.pubs[endpoint] = cache, pub
            self.explicit[endpoint] = FeedAddress(f"tcp://{ip}:{pub.port}",
                                                  f"tcp://{ip}:{pub.replay_port}" if replay else None)
        self.endpoints = tuple(self.caches)
        self.index = BlockIndex()
        self.metrics = Metrics("loadaware")
        self.feeds = KvEventsFeeds(self.index, self.metrics, lambda: self.endpoints,
                                   FeedOptions(self.explicit, replay_timeout_s=1.0))
        self.source = KvEventsPrefixSource(self.index, self.feeds)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.feeds.run())

    async def connected(self) -> None:
        await wait_until_async(lambda: self.feeds.covered(self.endpoints) == set(self.endpoints),
                               message="feeds connected")

    def truth(self, tokens: list[int], salt: str | None = None) -> dict[str, int]:
        return {ep: c.match(tokens, salt) for ep, c in self.caches.items() if c.match(tokens, salt)}

    async def converged(self, tokens: list[int], salt: str | None = None) -> None:
        await wait_until_async(
            lambda: self.source.lookup(tokens, self.endpoints, salt) == self.truth(tokens, salt),
            message=lambda: f"index == caches ({self.source.lookup(tokens, self.endpoints, salt)} vs "
                            f"{self.truth(tokens, salt)})")

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.feeds.close()
        for pub in self.pubs.values():
            await pub.stop()


@contextlib.asynccontextmanager
async def rig(n: int, base: int, **kw: object) -> AsyncIterator[Rig]:
    r = Rig(n, base, **kw)  # type: ignore[arg-type]
    try:
        r.start()
        await r.connected()
        yield r
    finally:
        await r.close()


PROMPT = list(range(5000, 5000 + 20 * BS + 3))


async def test_every_holder_credited_and_evictions_followed() -> None:
    async with rig(3, 30) as r:
        a, b, _c = r.endpoints
        r.caches[a].insert(PROMPT)
        r.caches[b].insert(PROMPT[:10 * BS])
        await r.converged(PROMPT)
        assert r.source.lookup(PROMPT, r.endpoints) == {a: 320, b: 160}
        for i in range(12):  # churn a past its capacity: evictions arrive as BlockRemoved
            r.caches[a].insert(list(range(10**5 + i * 1000, 10**5 + i * 1000 + 20 * BS)))
        await r.converged(PROMPT)
        assert r.source.lookup(PROMPT, r.endpoints).get(a, 0) < 320
        assert value(r.metrics.kv_events, "block_removed") > 0


async def test_gap_is_replayed() -> None:
    async with rig(1, 34) as r:
        (a,) = r.endpoints
        pub = r.pubs[a]
        r.caches[a].insert(PROMPT[:5 * BS])
        await r.converged(PROMPT)
        published, next_seq = pub.published, pub.next_seq
        pub.drop_next(2)  # two batches lost on the wire (still in the replay buffer)
        r.caches[a].insert(PROMPT[:10 * BS])
        pub.flush()  # the end of an engine step: one batch
        r.caches[a].insert(PROMPT)
        pub.flush()
        # Both batches were numbered and neither was sent, so nothing can be on its way to the index.
        assert (pub.next_seq, pub.published) == (next_seq + 2, published)
        assert r.source.lookup(PROMPT, r.endpoints) == {a: 80}  # nothing new arrived yet
        r.caches[a].insert(list(range(100, 100 + 3 * BS)))  # the next batch shows the gap
        await r.converged(PROMPT)
        assert r.source.lookup(PROMPT, r.endpoints) == {a: 320}
        assert value(r.metrics.kv_gaps, a) == 1
        assert value(r.metrics.kv_replays, "gap", "ok") == 1


async def test_gap_the_replay_cannot_fill_drops_the_index() -> None:
    """Removals may hide in a hole nobody can replay: never keep credit that may be phantom."""
    async with rig(1, 35, buffer_steps=1) as r:
        (a,) = r.endpoints
        cache, pub = r.caches[a], r.pubs[a]
        cache.insert(PROMPT)
        await r.converged(PROMPT)
        pub.drop_next(3)
        # Each change ends its own engine step (flush): one batch each.
        cache.clear()  # lost: AllBlocksCleared
        pub.flush()
        cache.insert(PROMPT[:4 * BS])  # lost
        pub.flush()
        cache.insert(list(range(7, 7 + 2 * BS)))  # lost, and the only batch the replay buffer still has
        pub.flush()
        cache.insert(list(range(900, 900 + 2 * BS)))  # arrives: gap
        await wait_until_async(lambda: value(r.metrics.kv_resets, "gap_unrecovered") >= 1,
                               message="the unrecoverable gap detected")
        # the prompt's first 4 blocks are really there again, but we cannot know it: under-credit, never over
        assert r.source.lookup(PROMPT, r.endpoints) == {}
        assert r.index.blocks(a) <= len(cache)


async def test_sequence_reset_drops_the_index() -> None:
    async with rig(2, 36) as r:
        a, b = r.endpoints
        for ep in r.endpoints:
            r.caches[ep].insert(PROMPT)
        await r.converged(PROMPT)
        # engine a restarts: new cache, numbering from 0 (without its connection dropping)
        r.pubs[a].restart()
        fresh = PrefixCache(capacity_blocks=200, block_size=BS)
        fresh.add_observer(r.pubs[a])
        r.caches[a] = fresh
        fresh.insert(list(range(1, 1 + 2 * BS)))
        await r.converged(PROMPT)
        assert r.source.lookup(PROMPT, r.endpoints) == {b: 320}
        assert value(r.metrics.kv_resets, "sequence_reset") == 1


async def test_late_joiner_replays_the_history() -> None:
    pub = KvEventsPublisher("127.0.0.38", 0, 0, BS)
    pub.start()
    cache = PrefixCache(200, BS)
    cache.add_observer(pub)
    cache.insert(PROMPT)  # published before anyone listened
    pub.flush()
    assert pub.published == 1  # on the wire, to nobody: only the replay can deliver it
    index, metrics = BlockIndex(), Metrics("loadaware")
    ep = "127.0.0.38:8000"
    feeds = KvEventsFeeds(index, metrics, lambda: (ep,), FeedOptions(
        {ep: FeedAddress(f"tcp://127.0.0.38:{pub.port}", f"tcp://127.0.0.38:{pub.replay_port}")}))
    task = asyncio.create_task(feeds.run())
    try:
        source = KvEventsPrefixSource(index, feeds)
        await wait_until_async(lambda: source.lookup(PROMPT, (ep,)) == {ep: 320}, message="the join replay")
        assert value(metrics.kv_replays, "join", "ok") >= 1 and value(metrics.kv_batches, ep, "replay") >= 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await feeds.close()
        await pub.stop()


async def test_vanished_and_removed_engines_lose_their_credit() -> None:
    async with rig(2, 39) as r:
        a, b = r.endpoints
        for ep in r.endpoints:
            r.caches[ep].insert(PROMPT)
        await r.converged(PROMPT)
        await r.pubs[a].stop()  # the engine dies: its publisher's connection goes
        await wait_until_async(lambda: r.source.lookup(PROMPT, r.endpoints) == {b: 320},
                               message="the vanished engine's credit dropped")
        assert value(r.metrics.kv_resets, "vanished") >= 1 and a not in r.feeds.covered(r.endpoints)
        r.endpoints = (a,)  # b leaves the fleet (the registry's event)
        r.feeds.on_changed(r.endpoints)
        await wait_until_async(lambda: b not in r.feeds.feeds, message="the departed engine's feed removed")
        assert r.index.blocks(b) == 0 and value(r.metrics.kv_resets, "removed") == 1


async def test_salted_blocks_credit_only_requests_with_the_same_salt() -> None:
    """Engines publish salted blocks as current vLLM does (msgpack maps tagged by "type", the salt in the
    first block's extra_keys): a salted request is credited only by engines holding its prompt under its
    salt, an unsalted one only by unsalted holders."""
    async with rig(3, 50, layout="map") as r:
        a, b, c = r.endpoints
        r.caches[a].insert(PROMPT[:10 * BS], salt="tenant-a")
        r.caches[b].insert(PROMPT, salt="tenant-b")
        r.caches[c].insert(PROMPT)
        for salt in ("tenant-a", "tenant-b", None):
            await r.converged(PROMPT, salt)
        assert r.source.lookup(PROMPT, r.endpoints, "tenant-a") == {a: 160}
        assert r.source.lookup(PROMPT, r.endpoints, "tenant-b") == {b: 320}
        assert r.source.lookup(PROMPT, r.endpoints) == {c: 320}
        assert r.source.lookup(PROMPT, r.endpoints, "tenant-z") == {}
        # the rest of tenant-a's prompt arrives as a chain continued from a salted block (no extra keys)
        r.caches[a].insert(PROMPT, salt="tenant-a")
        await r.converged(PROMPT, "tenant-a")
        assert r.source.lookup(PROMPT, r.endpoints, "tenant-a") == {a: 320}
        assert r.source.lookup(PROMPT, r.endpoints) == {c: 320}


@pytest.mark.parametrize("hash_format", ["int", "bytes"])
async def test_simulated_engines_publish_and_every_holder_is_credited(hash_format: str) -> None:
    base = 41 if hash_format == "int" else 45
    fleet = await start_fleet(3, base_ip=f"127.0.0.{base}", port=0,
                              kv_events=KvEventsOptions(port=0, replay_port=0, hash_format=hash_format))
    try:
        explicit = {f"{e.ip}:{e.port}": FeedAddress(f"tcp://{e.ip}:{fleet.kv_events[e.name].port}",
                                                    f"tcp://{e.ip}:{fleet.kv_events[e.name].replay_port}")
                    for e in fleet.engines}
        endpoints = tuple(explicit)
        index, metrics = BlockIndex(), Metrics("loadaware")
        feeds = KvEventsFeeds(index, metrics, lambda: endpoints, FeedOptions(explicit))
        task = asyncio.create_task(feeds.run())
        source = KvEventsPrefixSource(index, feeds)
        try:
            await wait_until_async(lambda: feeds.covered(endpoints) == set(endpoints), message="feeds connected")
            tok = SimTokenizer("sim/assets/tiny-model")
            prompt = "the shared system prompt of a hot conversation " * 40
            async with aiohttp.ClientSession() as session:
                for engine in fleet.engines[:2]:
                    async with session.post(engine.url + "/v1/completions",
                                            json={"prompt": prompt + engine.name, "max_tokens": 2}) as resp:
                        assert resp.status == 200
            ids = tok.tokenizer.encode(prompt).ids
            full = len(ids) // BS * BS
            a, b, _c = endpoints
            await wait_until_async(lambda: source.lookup(ids, endpoints) == {a: full, b: full},
                                   message="both holders credited")
            # a cache reset on the engine is an AllBlocksCleared event
            async with aiohttp.ClientSession() as session:
                async with session.post(fleet.engines[0].url + "/sim/reset_cache") as resp:
                    assert resp.status == 200
            await wait_until_async(lambda: source.lookup(ids, endpoints) == {b: full},
                                   message="the cache reset seen")
            assert value(metrics.kv_events, "all_blocks_cleared") == 1
            assert block_keys(ids, BS)  # the prompt is long enough to have blocks at all
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await feeds.close()
    finally:
        await fleet.stop()


HYBRID = ((0, "full_attention", None), (1, "sliding_window", 4 * BS), (2, "mamba", None), (3, "full_attention", None))


async def test_hybrid_model_credits_only_its_full_attention_groups() -> None:
    """An engine of a hybrid model publishes every block once per KV-cache group, as current vLLM does (maps
    tagged by "type", bytes hashes, group_idx, kv_cache_spec_kind): the sliding-window and mamba groups free
    blocks the full-attention groups keep, and the engine's credit is the minimum over its full-attention
    groups."""
    pub = KvEventsPublisher("127.0.0.60", 0, 0, BS, layout="map", hash_format="bytes", groups=HYBRID)
    pub.start()
    cache = PrefixCache(200, BS)
    cache.add_observer(pub)
    ep = "127.0.0.60:8000"
    index, metrics = BlockIndex(), Metrics("loadaware")
    feeds = KvEventsFeeds(index, metrics, lambda: (ep,), FeedOptions({ep: FeedAddress(
        f"tcp://127.0.0.60:{pub.port}", f"tcp://127.0.0.60:{pub.replay_port}")}))
    source = KvEventsPrefixSource(index, feeds)
    task = asyncio.create_task(feeds.run())
    try:
        await wait_until_async(lambda: feeds.covered((ep,)) == {ep}, message="feed connected")
        cache.insert(PROMPT)
        await wait_until_async(lambda: source.lookup(PROMPT, (ep,)) == {ep: 320}, message="the prompt credited")
        assert feeds.parts(ep) == (ep, f"{ep}#g3")
        assert value(metrics.kv_event_blocks, "uncredited_group") == 40  # 20 blocks in each of groups 1, 2
        keys = [b.key for b in iter_blocks(PROMPT, BS)]
        pub.remove_in_group(1, keys[:16])  # the window moved on
        pub.remove_in_group(2, keys[:19])  # mamba kept the last state only
        pub.flush()
        await wait_until_async(lambda: value(metrics.kv_event_blocks, "uncredited_group") == 75,
                               message="the other groups' removals arrived")
        assert source.lookup(PROMPT, (ep,)) == {ep: 320}
        pub.remove_in_group(3, keys[8:9])  # one full-attention group lost block 8: the hit ends there
        pub.flush()
        await wait_until_async(lambda: source.lookup(PROMPT, (ep,)) == {ep: 8 * BS}, message="the minimum")
        state = feeds.state()["engines"]
        assert isinstance(state, dict) and state[ep]["groups"] == {
            "0": "full_attention", "1": "sliding_window", "2": "mamba", "3": "full_attention"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await feeds.close()
        await pub.stop()


def free_pair(ip: str, start: int) -> int:
    """A port p with p and p + 1 both free on `ip` (vLLM's rank r binds the configured port + r)."""
    for port in range(start, start + 2000, 2):
        try:
            with contextlib.ExitStack() as stack:
                for p in (port, port + 1):
                    s = stack.enter_context(socket.socket())
                    s.bind((ip, p))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")


async def test_data_parallel_engine_is_credited_with_the_minimum_over_its_ranks() -> None:
    """One endpoint, two data-parallel ranks, each publishing on the ports + its rank with its own numbering
    and its rank in every batch; the sidecar subscribes to both (--kv-events-dp-ranks 2)."""
    ip = "127.0.0.61"
    pub_port = free_pair(ip, 31000)
    replay_port = free_pair(ip, pub_port + 2)
    caches, pubs = [], []
    for rank in (0, 1):
        pub = KvEventsPublisher(ip, pub_port + rank, replay_port + rank, BS, layout="map", hash_format="bytes",
                                data_parallel_rank=rank, groups=((0, "full_attention", None),))
        pub.start()
        cache = PrefixCache(200, BS)
        cache.add_observer(pub)
        caches.append(cache)
        pubs.append(pub)
    ep = f"{ip}:8000"
    index, metrics = BlockIndex(), Metrics("loadaware")
    feeds = KvEventsFeeds(index, metrics, lambda: (ep,), FeedOptions({}, pub_port, replay_port, dp_ranks=2))
    source = KvEventsPrefixSource(index, feeds)
    task = asyncio.create_task(feeds.run())
    try:
        await wait_until_async(lambda: feeds.covered((ep,)) == {ep}, message="both ranks connected")
        caches[0].insert(PROMPT)
        caches[1].insert(PROMPT[:6 * BS])
        await wait_until_async(lambda: index.blocks(f"{ep}#dp1") == 6 and index.blocks(ep) == 20,
                               message="both ranks indexed")
        assert source.lookup(PROMPT, (ep,)) == {ep: 6 * BS}
        caches[1].insert(PROMPT)
        await wait_until_async(lambda: source.lookup(PROMPT, (ep,)) == {ep: 320}, message="both ranks hold it")
        caches[0].clear()  # rank 0's AllBlocksCleared: nothing is sure to hit any more
        await wait_until_async(lambda: source.lookup(PROMPT, (ep,)) == {}, message="rank 0 cleared")
        assert all(f.rank_mismatches == 0 for f in feeds.feeds[ep])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await feeds.close()
        for pub in pubs:
            await pub.stop()


async def test_feeds_subscribe_and_replay_over_ipv6() -> None:
    """Engines on [::1]: the feed map's bracketed addresses reach ZMQ as tcp://[::1]:port, and both the SUB
    and the replay DEALER connect (ZMQ needs its IPV6 option for that)."""
    pubs = [KvEventsPublisher("::1", 0, 0, BS) for _ in range(2)]
    caches = []
    for pub in pubs:
        pub.start()
        caches.append(PrefixCache(capacity_blocks=200, block_size=BS))
        caches[-1].add_observer(pub)
    endpoints = ("[::1]:8000", "[::1]:8001")
    explicit = parse_feed_map(",".join(f"{ep}=[::1]:{p.port}/{p.replay_port}" for ep, p in zip(endpoints, pubs)))
    assert explicit[endpoints[0]].pub == f"tcp://[::1]:{pubs[0].port}"
    index, metrics = BlockIndex(), Metrics("loadaware")
    feeds = KvEventsFeeds(index, metrics, lambda: endpoints, FeedOptions(explicit, replay_timeout_s=1.0))
    source = KvEventsPrefixSource(index, feeds)
    task = asyncio.create_task(feeds.run())
    try:
        await wait_until_async(lambda: feeds.covered(endpoints) == set(endpoints), message="IPv6 feeds connected")
        caches[0].insert(PROMPT)
        caches[1].insert(PROMPT[:4 * BS])
        await wait_until_async(lambda: source.lookup(PROMPT, endpoints) == {endpoints[0]: 320, endpoints[1]: 64},
                               message=lambda: f"both credited over IPv6 ({source.lookup(PROMPT, endpoints)})")
        pubs[1].drop_next(1)  # one batch lost on the wire: the gap is replayed over the IPv6 DEALER
        caches[1].insert(PROMPT[:8 * BS])
        pubs[1].flush()  # the end of an engine step: one batch, the lost one
        caches[1].insert(PROMPT[:9 * BS])
        pubs[1].flush()  # the next batch shows the gap
        await wait_until_async(lambda: source.lookup(PROMPT, endpoints).get(endpoints[1]) == 9 * BS,
                               message=lambda: f"the replayed blocks ({source.lookup(PROMPT, endpoints)})")
        assert pubs[1].replays_served >= 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await feeds.close()
        for pub in pubs:
            await pub.stop()
