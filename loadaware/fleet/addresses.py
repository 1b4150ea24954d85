"""How endpoints, and the maps that hang other addresses on them, are written. Parsed here and only here.

    endpoint        HOST:PORT                        (an IPv6 host in brackets: [::1]:8000)
    endpoint list   ENDPOINT,ENDPOINT,...            (commas or newlines; duplicates dropped, order kept)
    instance map    INSTANCE_ID=ENDPOINT,...         (--lmcache-instance-map)
    feed map        ENDPOINT=HOST:PUB_PORT[/REPLAY_PORT][@RANKS],...   (--kv-events-endpoints)
    topic map       TOPIC=ENDPOINT,...               (--kv-events-topic-map: which engine publishes a topic)
                    RANKS = FIRST[-LAST]: the engine's data-parallel ranks, each publishing on the ports + rank

An endpoint's canonical text is what Envoy writes for a host (`Address::asString`): `10.0.0.1:8000`, and
`[fd00::1]:8000` for IPv6 in its compressed, lower-case form. That text is the registry's key, the value of
the destination header Envoy's override_host matches against its cluster's hosts, and, behind `http://` or
`tcp://`, the engine's URL; so every address any source names (flags, files, Envoy admin, Kubernetes) goes
through `format_hostport` or `parse_hostport` here. An unbracketed IPv6 address (`::1:8000`) is refused: it
cannot be told apart from an address without a port.

Every parser raises ValueError with a short reason; the configuration names the flag around it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")

# A DNS name or an IPv4 address: what may stand unbracketed before the port.
_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def canonical_host(host: str) -> str:
    """An IP address in its canonical text (IPv6 compressed, lower case); a name as given. No brackets.
    An IPv4-mapped IPv6 address keeps its dotted tail (`::ffff:10.0.0.1`), as inet_ntop, and so Envoy, writes
    it (Python's own spelling of it changed in 3.13)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None and not address.scope_id:
        return f"::ffff:{address.ipv4_mapped}"
    return str(address)


def is_ipv6(host: str) -> bool:
    return ":" in host


def url_host(host: str) -> str:
    """The host as it stands in a URL or before `:PORT`: canonical, IPv6 bracketed."""
    host = canonical_host(host)
    return f"[{host}]" if is_ipv6(host) else host


def format_hostport(host: str, port: int) -> str:
    """HOST:PORT in the canonical form, IPv6 hosts bracketed: the inverse of `parse_hostport`."""
    return f"{url_host(host)}:{port}"


def parse_hostport(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[IPV6]:PORT` -> (host without brackets, in canonical form; port 0-65535)."""
    item = text.strip()
    if not item:
        raise ValueError("empty address: expected HOST:PORT")
    if "://" in item:
        raise ValueError(f"{text!r}: give HOST:PORT, without a scheme")
    if item.startswith("["):
        close = item.find("]")
        if close < 0:
            raise ValueError(f"{text!r}: '[' without its ']'")
        host, rest = item[1:close], item[close + 1:]
        if not rest.startswith(":"):
            raise ValueError(f"{text!r}: expected [IPV6]:PORT")
        port_text = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{text!r}: {host!r} in brackets is not an IPv6 address") from None
    else:
        host, sep, port_text = item.partition(":")
        if not sep:
            raise ValueError(f"{text!r} has no port: expected HOST:PORT")
        if ":" in port_text:
            raise ValueError(f"{text!r}: an IPv6 host goes in brackets, as in [::1]:8000")
        if not host:
            raise ValueError(f"{text!r} has no host: expected HOST:PORT")
        if not _NAME.fullmatch(host):
            raise ValueError(f"{text!r}: {host!r} is not a host name or an IP address")
    if not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"{text!r}: the port {port_text!r} is not a number")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} out of range")
    return canonical_host(host), port


def host_of(endpoint: str) -> str:
    """The host of a canonical endpoint, without brackets."""
    return parse_hostport(endpoint)[0]


def port_of(endpoint: str) -> int:
    return parse_hostport(endpoint)[1]


def http_url(endpoint: str, path: str = "") -> str:
    """http://HOST:PORT/path of a canonical endpoint (IPv6 bracketed, as URLs want)."""
    return f"http://{endpoint}{path}"


def parse_endpoint(text: str) -> str:
    """An engine's address in the canonical form (see the module's doc)."""
    host, port = parse_hostport(text)
    if port == 0:
        raise ValueError(f"{text!r}: an endpoint needs a real port")
    return format_hostport(host, port)


def endpoint_of(host: str, port: int) -> str:
    """The canonical endpoint of a host and a port given apart (Envoy admin, Kubernetes); ValueError when
    they name no engine (an empty or malformed host, port 0)."""
    return parse_endpoint(format_hostport(host.strip(), port))


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


def split_tcp_url(url: str) -> tuple[str, int]:
    """tcp://HOST:PORT -> (host, port)."""
    scheme, sep, target = url.partition("://")
    if scheme != "tcp" or not sep:
        raise ValueError(f"{url!r} is not tcp://HOST:PORT")
    return parse_hostport(target)


def offset_port(url: str, offset: int) -> str:
    host, port = split_tcp_url(url)
    return tcp_url(host, port + offset)


def parse_ranks(text: str) -> tuple[int, ...]:
    """`FIRST[-LAST]` -> (FIRST, ..., LAST)."""
    first_text, sep, last_text = text.partition("-")
    first = int(first_text)
    last = int(last_text) if sep else first
    if first < 0 or last < first or last - first >= 1024:
        raise ValueError(f"{text!r} is not a rank range")
    return tuple(range(first, last + 1))


def tcp_url(host: str, port: int) -> str:
    """tcp://HOST:PORT as ZMQ takes it (IPv6 bracketed; the socket also needs zmq.IPV6 set)."""
    return f"tcp://{format_hostport(host, port)}"


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
