"""The engines-connect KV-event pattern: the sidecar binds one SUB socket, the engines' PUB sockets connect to it.

vLLM decides who binds from its `endpoint`: `tcp://*:P` binds (the sidecar connects to each engine, feeds.py);
`tcp://HOST:P` connects, to a subscriber that binds (this module; `--kv-events-bind`). llm-d's guides deploy
it so: every engine's `endpoint` is the picker's Service, and its `topic` `kv@<pod ip>@<model>` names the pod.

Every message carries its topic, which names the engine: an explicit topic -> endpoint map first, else the
convention `kv@<ip>@<model>`, resolved to the one fleet endpoint on that ip (the pool's target port comes from
discovery). A topic that names no endpoint of the fleet is counted and dropped: nothing unknown earns credit.
Each engine gets its own EngineFeed (sequence rules, replay from `tcp://<ip>:<replay port>`, groups) fed by
this one socket instead of a SUB of its own.

Vanished engines: ZMQ tells which connection each message came from (its SRCFD) and which connection closed
(the monitor's DISCONNECTED carries the same fd), so an engine that dies or restarts loses its credit when its
connection goes, as in the bind pattern. ZMTP heartbeats catch a peer that vanished without closing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from loadaware.fleet.addresses import FeedAddress, tcp_url
from loadaware.prefix.kvevents.feeds import EngineFeed, KvEventsFeeds

log = logging.getLogger(__name__)

TOPIC_PREFIX = "kv"


def convention_ip(topic: str) -> str | None:
    """The pod ip of llm-d's topic `kv@<ip>@<model>` (None: not that form)."""
    parts = topic.split("@", 2)
    if len(parts) != 3 or parts[0] != TOPIC_PREFIX or not parts[1]:
        return None
    return parts[1].strip("[]")


def endpoint_of_topic(topic: str, explicit: Mapping[str, str], endpoints: Sequence[str]) -> str | None:
    """The fleet endpoint a topic names: the explicit map's (when that endpoint is in the fleet), else the one
    endpoint on the convention's ip. Two endpoints on one ip are ambiguous: None (the explicit map decides)."""
    if topic in explicit:
        endpoint = explicit[topic]
        return endpoint if endpoint in endpoints else None
    ip = convention_ip(topic)
    if ip is None:
        return None
    on_ip = [ep for ep in endpoints if ep.rpartition(":")[0].strip("[]") == ip]
    return on_ip[0] if len(on_ip) == 1 else None


class InboundKvEvents:
    """One bound SUB socket for every engine that connects; per engine an EngineFeed attached to `feeds`."""

    def __init__(self, feeds: KvEventsFeeds, bind: str, explicit: Mapping[str, str], replay_port: int,
                 endpoints: Callable[[], tuple[str, ...]]) -> None:
        self.feeds = feeds
        host, _, port = bind.rpartition(":")
        self.bind_url = tcp_url(host.strip("[]") or "0.0.0.0", int(port))
        self.explicit = dict(explicit)
        self.replay_port = replay_port
        self.endpoints = endpoints
        self.bound_url: str | None = None  # what the socket really bound (port 0 asks for any free port)
        self.unknown_topics = 0  # messages whose topic names no endpoint of the fleet
        self._by_topic: dict[bytes, tuple[str, EngineFeed]] = {}  # topic -> (endpoint, its feed)
        self._fd_topics: dict[int, set[bytes]] = {}  # connection -> topics seen on it

    def _feed_for(self, topic: bytes) -> EngineFeed | None:
        known = self._by_topic.get(topic)
        if known is not None:
            attached = self.feeds.feeds.get(known[0])
            if attached is not None and attached[0] is known[1]:
                return known[1]
            del self._by_topic[topic]  # the endpoint left the fleet (its feed went with it): resolve afresh
        endpoint = endpoint_of_topic(topic.decode(errors="replace"), self.explicit, self.endpoints())
        if endpoint is None:
            return None
        host = endpoint.rpartition(":")[0].strip("[]")
        replay = tcp_url(host, self.replay_port) if self.replay_port > 0 else None
        feed = EngineFeed(endpoint, FeedAddress(f"{self.bound_url} (topic {topic.decode(errors='replace')})", replay),
                          self.feeds.shared, topic.decode(errors="replace"))
        self.feeds.attach(endpoint, [feed])
        self._by_topic[topic] = (endpoint, feed)
        return feed

    async def run(self) -> None:
        sub = self.feeds.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
        sub.setsockopt(zmq.SUBSCRIBE, b"")  # the topic names the engine: take every one, filter here
        if ":" in self.bind_url.rpartition(":")[0]:
            sub.setsockopt(zmq.IPV6, 1)
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sub.bind(self.bind_url)
        self.bound_url = sub.getsockopt_string(zmq.LAST_ENDPOINT)
        log.info("kv-events: engines connect to %s", self.bound_url)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    self._on_disconnect(parse_monitor_message(await monitor.recv_multipart()))
                if sub in ready:
                    frames = await sub.recv_multipart(copy=False)
                    await self._on_message(frames)
        finally:
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _on_message(self, frames: list[zmq.Frame]) -> None:
        topic = frames[0].bytes
        feed = self._feed_for(topic)
        if feed is None:
            self.unknown_topics += 1
            if self.unknown_topics == 1:
                log.warning("kv-events: topic %r names no endpoint of the fleet; its events are ignored", topic)
            return
        with contextlib.suppress(zmq.ZMQError):
            self._fd_topics.setdefault(int(frames[0].get(zmq.SRCFD)), set()).add(topic)
        if not feed.connected:
            feed.connected = True
            feed.metrics.kv_connected.labels(feed.endpoint).set(1)
        await feed.on_message([f.bytes for f in frames])
        feed.synced = True

    def _on_disconnect(self, event: Mapping[str, object]) -> None:
        if event.get("event") != zmq.EVENT_DISCONNECTED:
            return
        value = event.get("value")
        for topic in self._fd_topics.pop(int(value) if isinstance(value, int) else -1, set()):
            known = self._by_topic.get(topic)
            if known is None:
                continue
            feed = known[1]
            # The engine's connection closed (crash, restart, scale-down): what it held is unknowable until it
            # publishes again, so no credit meanwhile; its next batch joins and replays.
            feed.connected = feed.synced = False
            feed.metrics.kv_connected.labels(feed.endpoint).set(0)
            feed.reset("vanished")

    def state(self) -> dict[str, object]:
        return {"bind": self.bound_url or self.bind_url, "topics": {t.decode(errors="replace"): ep
                                                                    for t, (ep, _) in self._by_topic.items()},
                "unknown_topic_messages": self.unknown_topics}
