"""How endpoints, and the maps that hang other addresses on them, are written. Parsed here and only here.

    endpoint        HOST:PORT                        (IPv6 hosts may be bracketed)
    endpoint list   ENDPOINT,ENDPOINT,...            (commas or newlines; duplicates dropped, order kept)
    instance map    INSTANCE_ID=ENDPOINT,...         (--lmcache-instance-map)
    feed map        ENDPOINT=HOST:PUB_PORT[/REPLAY_PORT][@RANKS],...   (--kv-events-endpoints)
    topic map       TOPIC=ENDPOINT,...               (--kv-events-topic-map: which engine publishes a topic)
                    RANKS = FIRST[-LAST]: the engine's data-parallel ranks, each publishing on the ports + rank

Every parser raises ValueError with a short reason; the configuration names the flag around it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def parse_hostport(text: str) -> tuple[str, int]:
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not HOST:PORT")
    host = host.strip("[]")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} out of range")
    return host, port


def parse_endpoint(text: str) -> str:
    host, port = parse_hostport(text)
    if port == 0:
        raise ValueError(f"{text!r}: an endpoint needs a real port")
    return f"{host}:{port}"


def parse_endpoint_list(text: str) -> tuple[str, ...]:
    items = [t.strip() for t in text.replace("\n", ",").split(",") if t.strip()]
    return tuple(dict.fromkeys(parse_endpoint(item) for item in items))


def parse_map(text: str, key: Callable[[str], K], value: Callable[[str], V], form: str) -> dict[K, V]:
    """`KEY=VALUE,...`: the one grammar of every map setting; `form` names the expected shape in errors."""
    out: dict[K, V] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        left, sep, right = item.partition("=")
        if not sep or not left.strip():
            raise ValueError(f"{item!r} is not {form}")
        try:
            out[key(left.strip())] = value(right.strip())
        except ValueError as exc:
            raise ValueError(f"{item!r} is not {form}: {exc}") from None
    return out


def parse_instance_map(text: str) -> dict[str, str]:
    """`INSTANCE_ID=HOST:PORT,...` -> {instance id: endpoint}."""
    return parse_map(text, str, parse_endpoint, "INSTANCE_ID=HOST:PORT")


@dataclass(frozen=True, slots=True)
class FeedAddress:
    """Where one engine publishes its KV events (ZMQ PUB) and answers replays (ZMQ ROUTER; None = none)."""

    pub: str  # tcp://host:port
    replay: str | None
    ranks: tuple[int, ...] | None = None  # data-parallel ranks behind the endpoint; None = the global setting

    def __str__(self) -> str:
        text = self.pub if self.replay is None else f"{self.pub} (replay {self.replay})"
        return text if self.ranks is None else f"{text} ranks {list(self.ranks)}"

    def for_rank(self, rank: int) -> FeedAddress:
        """Where data-parallel rank `rank` publishes: both ports plus the rank, as vLLM's
        ZmqEventPublisher.offset_endpoint_port does."""
        if rank == 0:
            return FeedAddress(self.pub, self.replay)
        return FeedAddress(offset_port(self.pub, rank), None if self.replay is None else offset_port(self.replay, rank))


def offset_port(url: str, offset: int) -> str:
    base, _, port = url.rpartition(":")
    return f"{base}:{int(port) + offset}"


def parse_ranks(text: str) -> tuple[int, ...]:
    """`FIRST[-LAST]` -> (FIRST, ..., LAST)."""
    first_text, sep, last_text = text.partition("-")
    first = int(first_text)
    last = int(last_text) if sep else first
    if first < 0 or last < first or last - first >= 1024:
        raise ValueError(f"{text!r} is not a rank range")
    return tuple(range(first, last + 1))


def tcp_url(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def parse_feed_address(text: str) -> FeedAddress:
    """`HOST:PUB_PORT[/REPLAY_PORT][@FIRST[-LAST]]`; both ports real, also for the last rank."""
    text, at, ranks_text = text.partition("@")
    ranks = parse_ranks(ranks_text) if at else None
    target, _, replay_text = text.partition("/")
    host, port = parse_hostport(target)
    replay = int(replay_text) if replay_text else None
    top = max(ranks) if ranks else 0
    if port == 0 or port + top > 65535 or (replay is not None and not 0 < replay <= 65535 - top):
        raise ValueError("ports must be real")
    return FeedAddress(tcp_url(host, port), tcp_url(host, replay) if replay is not None else None, ranks)


def parse_feed_map(text: str) -> dict[str, FeedAddress]:
    """`ENDPOINT=HOST:PUB_PORT[/REPLAY_PORT],...` -> {endpoint: FeedAddress}."""
    return parse_map(text, parse_endpoint, parse_feed_address, "ENDPOINT=HOST:PUB_PORT[/REPLAY_PORT][@RANKS]")


def parse_topic_map(text: str) -> dict[str, str]:
    """`TOPIC=HOST:PORT,...` -> {KV-event topic: endpoint} (engines that connect to --kv-events-bind)."""
    return parse_map(text, str, parse_endpoint, "TOPIC=HOST:PORT")
