"""The admin gRPC listener (--admin-listen, loopback by default): loadaware.v1.Router, server reflection and
grpc.health.v1, apart from the ext_proc port.

A prefix-cache-aware router knows which prompts were recently served where: whoever can call Explain with a
prompt learns whether someone else sent it lately (the matched tokens). So the debug API is not served where
the gateway's traffic arrives: the ext_proc port answers ext_proc and health only, and this listener stays on
loopback, reached with `kubectl port-forward` (or `grpcurl -plaintext 127.0.0.1:9004` beside the process).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import grpc
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection

from loadaware.api.servicer import SERVICE_NAME as ROUTER_SERVICE_NAME
from loadaware.api.servicer import RouterServicer
from loadaware.fleet.addresses import parse_hostport

# What reflection lists on the admin port: exactly the services it serves (ext_proc is not one of them).
REFLECTED_SERVICES = (ROUTER_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)


def admin_server(router: RouterServicer, add_health: Callable[[grpc.aio.Server], None]) -> grpc.aio.Server:
    """A server with the debug API, health and reflection, not yet bound. SO_REUSEPORT off: a second process
    on the same address must fail to bind rather than silently share the port."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    router.add_to(server)
    add_health(server)
    reflection.enable_server_reflection(REFLECTED_SERVICES, server)
    return server


def is_loopback(listen: str) -> bool:
    """HOST:PORT names a loopback address (127.0.0.0/8, ::1, localhost): only this host's processes, and
    `kubectl port-forward` into the pod's network namespace, reach it."""
    try:
        host = parse_hostport(listen)[0]
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
