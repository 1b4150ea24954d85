"""Loopback addresses: the fixed ports of the shipped configs, free ports, and who listens where."""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Callable, Sequence

from loadaware.fleet.addresses import format_hostport, parse_hostport

# Baked into the shipped Envoy configs (envoy/*.yaml).
ENVOY_LISTEN_PORT = 10000
ENVOY_ADMIN_PORT = 9901
SIDECAR_PORT = 9002
# envoy/envoy-inference-pool.yaml's, beside envoy.yaml's.
PICKER_LISTEN_PORT = 10001
PICKER_ADMIN_PORT = 9911

Address = tuple[str, int]


# Ports handed out lately by this process: a port is free until whoever asked binds it, so two calls in a row
# (--listen, then --admin-listen) could otherwise get the same one.
_RECENT: deque[int] = deque(maxlen=256)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct TCP ports that were free a moment ago on `host` (racy by nature, fine on loopback), none
    of them handed out lately by this process. The sockets stay bound until all are chosen, so they differ."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)  # kept bound: the kernel will not return it again meanwhile
            port = int(s.getsockname()[1])
            if port not in _RECENT:
                ports.append(port)
        _RECENT.extend(ports)
        return ports
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def split_hostport(addr: str) -> Address:
    """HOST:PORT or [IPV6]:PORT (the sidecar's own grammar) -> (bare host, port)."""
    return parse_hostport(addr)


def accepts(host: str, port: int, timeout: float = 0.2) -> bool:
    """Something listens on host:port (a TCP connect succeeds)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def busy_addresses(addresses: Sequence[Address]) -> list[str]:
    return [format_hostport(host, port) for host, port in addresses if accepts(host, port)]


def wait_addresses_free(addresses: Sequence[Address], timeout: float, poll_s: float = 1.0,
                        on_busy: Callable[[list[str]], None] | None = None) -> float:
    """Wait until nothing listens on any of `addresses` (a run that does not share our lock may hold them;
    Envoy and grpc bind with SO_REUSEPORT, so starting beside it would silently split its traffic).
    Returns the seconds waited; raises TimeoutError naming the busy addresses."""
    t0 = time.monotonic()
    while busy := busy_addresses(addresses):
        if time.monotonic() - t0 >= timeout:
            raise TimeoutError(f"addresses still in use by another run after {timeout:.0f}s: {', '.join(busy)}")
        if on_busy is not None:
            on_busy(busy)
        time.sleep(poll_s)
    return time.monotonic() - t0
