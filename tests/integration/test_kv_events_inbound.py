"""The engines-connect KV-event pattern on real ZMQ sockets: the sidecar binds, publishers connect (as vLLM does
with `endpoint: tcp://HOST:PORT`), each message's topic names its engine, and a closed connection drops that
engine's credit. The same pattern against real vLLM is in tests/vllm/test_engines_connect.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from loadaware.fleet.addresses import parse_topic_map
from loadaware.prefix.blocks import BlockIndex
from loadaware.prefix.kvevents.feeds import FeedOptions, KvEventsFeeds
from loadaware.prefix.kvevents.inbound import InboundKvEvents, convention_ip, endpoint_of_topic
from loadaware.prefix.kvevents.query import KvEventsPrefixSource
from loadaware.telemetry.metrics import Metrics
from sim.kv_events_publisher import KvEventsPublisher
from sim.prefix_cache import PrefixCache
from testkit.ports import free_port
from tests.conftest import wait_until_async

BS = 16
PROMPT = list(range(7000, 7000 + 12 * BS + 5))


def test_topics_name_endpoints() -> None:
    fleet = ("10.1.0.5:8000", "10.1.0.6:8000", "10.1.0.7:8000", "10.1.0.7:8001")
    assert convention_ip("kv@10.1.0.5@Qwen/Qwen2.5-7B") == "10.1.0.5"
    assert convention_ip("kv@[fd00::1]@m") == "fd00::1"
    assert convention_ip("") is None and convention_ip("kv@@m") is None and convention_ip("other@1.2.3.4@m") is None
    assert endpoint_of_topic("kv@10.1.0.6@any-model", {}, fleet) == "10.1.0.6:8000"
    assert endpoint_of_topic("kv@10.1.0.9@m", {}, fleet) is None  # not in the fleet: no credit
    assert endpoint_of_topic("kv@10.1.0.7@m", {}, fleet) is None  # two endpoints on the ip: ambiguous
    explicit = parse_topic_map("engine-a=10.1.0.7:8001, kv@10.1.0.5@m=10.1.0.6:8000")
    assert endpoint_of_topic("engine-a", explicit, fleet) == "10.1.0.7:8001"
    assert endpoint_of_topic("kv@10.1.0.5@m", explicit, fleet) == "10.1.0.6:8000"  # the map wins
    assert endpoint_of_topic("engine-a", explicit, fleet[:3]) is None  # mapped, but not in the fleet


def engine(topic: str, connect: str, replay: bool = False) -> tuple[PrefixCache, KvEventsPublisher]:
    pub = KvEventsPublisher("127.0.0.1", 0, 0 if replay else None, BS, topic=topic, connect=connect)
    pub.start()
    cache = PrefixCache(capacity_blocks=200, block_size=BS)
    cache.add_observer(pub)
    return cache, pub


class Rig:
    """The sidecar's inbound socket and feeds; publishers over real prefix caches connect to it."""

    def __init__(self, endpoints: tuple[str, ...], topic_map: dict[str, str] | None = None,
                 bind: str = "127.0.0.1:0", replay_port: int = 0) -> None:
        self.endpoints = endpoints
        self.index = BlockIndex()
        self.metrics = Metrics("loadaware")
        self.feeds = KvEventsFeeds(self.index, self.metrics, lambda: self.endpoints,
                                   FeedOptions(replay_timeout_s=1.0))
        self.inbound = InboundKvEvents(self.feeds, bind, topic_map or {}, replay_port, lambda: self.endpoints)
        self.source = KvEventsPrefixSource(self.index, self.feeds)
        self.tasks: list[asyncio.Task[None]] = []
        self.pubs: list[KvEventsPublisher] = []

    async def start(self) -> None:
        self.tasks = [asyncio.create_task(self.feeds.run()), asyncio.create_task(self.inbound.run())]
        await wait_until_async(lambda: self.inbound.bound_url, message="inbound socket bound")

    def engine(self, topic: str) -> tuple[PrefixCache, KvEventsPublisher]:
        assert self.inbound.bound_url is not None
        cache, pub = engine(topic, self.inbound.bound_url)
        self.pubs.append(pub)
        return cache, pub

    async def credit(self, want: dict[str, int]) -> None:
        await wait_until_async(lambda: self.source.lookup(PROMPT, self.endpoints) == want,
                               message=lambda: f"credit {want}, have {self.source.lookup(PROMPT, self.endpoints)}")

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.feeds.close()
        for pub in self.pubs:
            await pub.stop()


@contextlib.asynccontextmanager
async def rig(endpoints: tuple[str, ...], topic_map: dict[str, str] | None = None, **kw: object
              ) -> AsyncIterator[Rig]:
    r = Rig(endpoints, topic_map, **kw)  # type: ignore[arg-type]
    try:
        await r.start()
        yield r
    finally:
        await r.close()


async def insert_until_credited(r: Rig, cache: PrefixCache, tokens: list[int], want: dict[str, int]) -> None:
    """A connecting PUB drops what it sends before its connection is up (ZMQ's slow joiner): the first store
    may be lost, so store again (a new sequence number each time) until the credit shows."""
    async def settled() -> bool:
        cache.clear()
        cache.insert(tokens)
        await asyncio.sleep(0.1)
        return r.source.lookup(PROMPT, r.endpoints) == want
    await wait_until_async(settled, message=lambda: f"credit {want}, have {r.source.lookup(PROMPT, r.endpoints)}")


async def test_connecting_engines_are_credited_by_topic_and_lose_it_when_they_go() -> None:
    a, b, c = "127.0.0.1:18001", "127.0.0.2:18001", "127.0.0.3:18001"
    async with rig((a, b, c), {"engine-c": c}) as r:
        cache_a, pub_a = r.engine("kv@127.0.0.1@tiny")
        cache_b, _ = r.engine("kv@127.0.0.2@tiny")
        cache_c, _ = r.engine("engine-c")
        stranger, _ = r.engine("kv@127.0.0.9@tiny")  # an ip outside the fleet: never credited
        await insert_until_credited(r, cache_a, PROMPT, {a: 12 * BS})
        await insert_until_credited(r, cache_b, PROMPT[:5 * BS], {a: 12 * BS, b: 5 * BS})
        await insert_until_credited(r, cache_c, PROMPT[:3 * BS], {a: 12 * BS, b: 5 * BS, c: 3 * BS})
        assert r.feeds.covered((a, b, c)) == {a, b, c}
        assert r.inbound.state()["topics"] == {"kv@127.0.0.1@tiny": a, "kv@127.0.0.2@tiny": b, "engine-c": c}
        async def stranger_counted() -> bool:
            stranger.clear()
            stranger.insert(PROMPT)
            await asyncio.sleep(0.1)
            return r.inbound.unknown_topics > 0
        await wait_until_async(stranger_counted, message="the stranger's batches counted, not credited")
        assert r.source.lookup(PROMPT, r.endpoints) == {a: 12 * BS, b: 5 * BS, c: 3 * BS}
        await pub_a.stop()  # the engine goes away: its connection closes
        await r.credit({b: 5 * BS, c: 3 * BS})
        assert r.feeds.covered((a, b, c)) == {b, c}
        # It comes back (a restart: numbering from 0 again) and is credited afresh.
        cache_a2, _ = r.engine("kv@127.0.0.1@tiny")
        await insert_until_credited(r, cache_a2, PROMPT[:2 * BS], {a: 2 * BS, b: 5 * BS, c: 3 * BS})


async def test_a_late_sidecar_replays_from_the_engines_replay_port() -> None:
    a = "127.0.0.1:18002"
    port = free_port()
    cache, pub = engine("kv@127.0.0.1@tiny", f"tcp://127.0.0.1:{port}", replay=True)
    try:
        cache.insert(PROMPT)  # published while nobody listens: lost live, kept in the engine's replay buffer
        pub.flush()
        assert pub.next_seq == 1
        async with rig((a,), bind=f"127.0.0.1:{port}", replay_port=pub.replay_port) as r:
            async def next_batch_joins() -> bool:
                cache.insert(list(range(90_000 + pub.next_seq * 100, 90_000 + pub.next_seq * 100 + BS)))
                pub.flush()
                await asyncio.sleep(0.1)
                return r.source.lookup(PROMPT, (a,)) == {a: 12 * BS}
            await wait_until_async(next_batch_joins, message="the batch before the sidecar was up, replayed")
            assert r.metrics.kv_replays.labels("join", "ok")._value.get() >= 1
    finally:
        await pub.stop()
