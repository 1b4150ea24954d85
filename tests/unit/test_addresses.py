"""The address grammar (loadaware/fleet/addresses.py): every HOST:PORT the sidecar reads or writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadaware.config import ConfigError, from_args
from loadaware.fleet.addresses import (
    FeedAddress,
    endpoint_of,
    format_hostport,
    host_of,
    http_url,
    offset_port,
    parse_endpoint,
    parse_endpoint_list,
    parse_feed_address,
    parse_hostport,
    parse_instance_map,
    port_of,
    split_tcp_url,
    tcp_url,
)
from loadaware.fleet.discovery.file import EndpointsFileWatcher
from loadaware.fleet.registry import EndpointRegistry


@pytest.mark.parametrize(("text", "host", "port"), [
    ("127.0.0.1:8000", "127.0.0.1", 8000),
    ("  10.1.2.3:80 ", "10.1.2.3", 80),
    ("localhost:9002", "localhost", 9002),
    ("vllm-0.vllm.llm.svc.cluster.local:8000", "vllm-0.vllm.llm.svc.cluster.local", 8000),
    ("[::1]:8000", "::1", 8000),
    ("[::]:9002", "::", 9002),
    ("[FD00:0:0:0:0:0:0:5]:8000", "fd00::5", 8000),  # canonical: compressed, lower case
    ("[::ffff:10.0.0.1]:8000", "::ffff:10.0.0.1", 8000),  # as inet_ntop (Envoy) writes it
    ("[::FFFF:a00:1]:8000", "::ffff:10.0.0.1", 8000),
    ("0.0.0.0:0", "0.0.0.0", 0),
])
def test_hostports_parse_to_the_canonical_host(text: str, host: str, port: int) -> None:
    assert parse_hostport(text) == (host, port)


@pytest.mark.parametrize(("text", "reason"), [
    ("", "empty address"),
    ("10.0.0.1", "has no port"),
    ("::1:8000", "IPv6 host goes in brackets"),
    ("fd00::5:8000", "IPv6 host goes in brackets"),
    ("[::1]8000", r"expected \[IPV6\]:PORT"),
    ("[::1:8000", "without its"),
    ("[engine]:8000", "not an IPv6 address"),
    ("[10.0.0.1]:8000", "not an IPv6 address"),
    (":8000", "has no host"),
    ("10.0.0.1:", "is not a number"),
    ("10.0.0.1:http", "is not a number"),
    ("10.0.0.1:-1", "is not a number"),
    ("10.0.0.1:٣", "is not a number"),  # a non-ASCII digit int() would take
    ("10.0.0.1:65536", "out of range"),
    ("http://10.0.0.1:8000", "without a scheme"),
    ("bad host:80", "not a host name"),
    ("a/b:80", "not a host name"),
    ("-x:80", "not a host name"),
])
def test_bad_hostports_are_refused_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_hostport(text)


@pytest.mark.parametrize(("host", "port", "text"), [
    ("127.0.0.2", 8000, "127.0.0.2:8000"),
    ("::1", 8000, "[::1]:8000"),
    ("fd00:0::5", 80, "[fd00::5]:80"),
    ("engine-0", 1, "engine-0:1"),
])
def test_format_and_parse_round_trip(host: str, port: int, text: str) -> None:
    assert format_hostport(host, port) == text
    assert parse_hostport(text) == (parse_hostport(text)[0], port)
    assert format_hostport(*parse_hostport(text)) == text
    assert parse_endpoint(text) == text
    assert endpoint_of(host, port) == text
    assert host_of(text) == parse_hostport(text)[0] and port_of(text) == port


def test_endpoints_keep_ipv6_brackets_and_dedupe_spellings() -> None:
    # The bug this grammar fixes: `[::1]:8000` used to come out as `::1:8000`, which no URL and no Envoy
    # host matches.
    assert parse_endpoint("[::1]:8000") == "[::1]:8000"
    assert parse_endpoint_list("[::1]:8000,\n[0:0:0:0:0:0:0:1]:8000, 127.0.0.2:8000") == (
        "[::1]:8000", "127.0.0.2:8000")
    assert parse_instance_map("engine-a=[::1]:8001") == {"engine-a": "[::1]:8001"}


@pytest.mark.parametrize(("host", "port"), [("", 8000), ("::1", 0), ("bad host", 80), ("[::1]", 80)])
def test_endpoint_of_refuses_what_names_no_engine(host: str, port: int) -> None:
    with pytest.raises(ValueError):
        endpoint_of(host, port)


def test_urls_of_endpoints() -> None:
    assert http_url("[::1]:8000", "/metrics") == "http://[::1]:8000/metrics"
    assert http_url("10.0.0.1:8000", "/v1/models") == "http://10.0.0.1:8000/v1/models"
    assert tcp_url("::1", 5557) == "tcp://[::1]:5557"
    assert tcp_url("10.0.0.1", 5557) == "tcp://10.0.0.1:5557"
    assert split_tcp_url("tcp://[::1]:5557") == ("::1", 5557)
    assert offset_port("tcp://[::1]:5557", 2) == "tcp://[::1]:5559"
    with pytest.raises(ValueError, match="tcp://"):
        split_tcp_url("http://[::1]:5557")


def test_feed_addresses_take_ipv6_hosts() -> None:
    feed = parse_feed_address("[::1]:5557/5558@0-1")
    assert feed == FeedAddress("tcp://[::1]:5557", "tcp://[::1]:5558", (0, 1))
    assert feed.for_rank(1) == FeedAddress("tcp://[::1]:5558", "tcp://[::1]:5559")
    with pytest.raises(ValueError, match="brackets"):
        parse_feed_address("::1:5557")


def test_listen_flags_keep_ipv6_brackets() -> None:
    s = from_args(["--listen", "[::1]:9002", "--metrics-listen", "[::]:9102", "--admin-listen", "[::1]:9004",
                   "--admin-http-listen", "[::1]:9005", "--endpoints", "[::1]:8000,[::1]:8001"], environ={})
    assert (s.listen, s.metrics_listen, s.admin_listen, s.admin_http_listen) == (
        "[::1]:9002", "[::]:9102", "[::1]:9004", "[::1]:9005")
    assert s.endpoints == ("[::1]:8000", "[::1]:8001")


def test_listen_clash_is_found_across_ipv6_spellings() -> None:
    with pytest.raises(ConfigError, match="--metrics-listen"):
        from_args(["--listen", "[::1]:9002", "--metrics-listen", "[0::1]:9002"], environ={})
    with pytest.raises(ConfigError, match="--listen"):
        from_args(["--listen", "::1:9002"], environ={})


def test_endpoints_file_keeps_ipv6_brackets_and_refuses_unbracketed(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.txt"
    path.write_text("[::1]:8000  # engine a\n[FD00::5]:8000\n10.0.0.1:8000\n")
    registry = EndpointRegistry()
    watcher = EndpointsFileWatcher(str(path), registry)
    assert watcher.poll()
    assert set(registry.snapshot()) == {"[::1]:8000", "[fd00::5]:8000", "10.0.0.1:8000"}
    path.write_text("::1:8000\n")  # ambiguous: refused, the last good set stays
    assert not watcher.poll()
    assert set(registry.snapshot()) == {"[::1]:8000", "[fd00::5]:8000", "10.0.0.1:8000"}
