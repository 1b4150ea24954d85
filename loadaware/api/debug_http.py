"""The sidecar's HTTP listeners, each on its own address with only its own pages:

- `/metrics` for Prometheus on --metrics-listen (reachable by the monitoring namespace);
- `/debug/decisions` and `/debug/state` for people on --admin-http-listen (loopback by default: reached with
  `kubectl port-forward`, like the gRPC debug API on --admin-listen).

/debug/decisions renders decisions without prompt text or token ids (Decision.as_dict carries neither), but
which engines were credited with a prefix, and when, is still a hint about other tenants' traffic: hence a
listener of its own, not the metrics port.

Each page is rendered off the event loop (docs/architecture.md, "Fleet size"): at 10,000 endpoints /metrics
is tens of thousands of series, and a decision waiting on the loop meanwhile would wait for all of them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from loadaware.api.offloop import dumps_in_pieces, off_loop
from loadaware.fleet.addresses import parse_hostport
from loadaware.lifecycle import Decision

DEFAULT_DECISIONS = 50
# /metrics goes out in slices of this size, the loop free between them: at 10,000 busy endpoints the page is
# ~13 MiB, and handed to the transport whole it held the loop for ~13 ms while decisions waited.
BODY_SLICE = 256 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpSite:
    """One aiohttp application on one address; a path it does not list answers 404."""

    def __init__(self, routes: Sequence[tuple[str, Handler]]) -> None:
        self.routes = routes
        self.runner: web.AppRunner | None = None
        self.port: int | None = None  # the bound port (the address may ask for port 0)

    async def start(self, listen: str) -> int:
        app = web.Application()
        for path, handler in self.routes:
            app.router.add_get(path, handler)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        host, port = parse_hostport(listen)
        await web.TCPSite(self.runner, host, port).start()
        self.port = int(self.runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


class MetricsHttp(HttpSite):
    """/metrics only: what Prometheus scrapes, and nothing about individual requests."""

    def __init__(self, render_metrics: Callable[[], Awaitable[bytes]]) -> None:
        super().__init__([("/metrics", self._metrics)])
        self.render_metrics = render_metrics  # renders off the loop itself (the app knows what is safe where)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        body = await self.render_metrics()
        if len(body) <= BODY_SLICE:
            return web.Response(body=body, content_type="text/plain", charset="utf-8")
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        response.content_length = len(body)
        await response.prepare(request)
        view = memoryview(body)
        for start in range(0, len(body), BODY_SLICE):
            await response.write(view[start:start + BODY_SLICE])  # waits while the client's buffer is full
            await asyncio.sleep(0)  # a full buffer or not, the loop runs what waits between two slices
        await response.write_eof()
        return response


class DebugHttp(HttpSite):
    """/debug/decisions (the last N decisions, no prompt text) and /debug/state (fleet, loads, feeds)."""

    def __init__(self, recent: Callable[[int], list[Decision]],
                 state: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        super().__init__([("/debug/decisions", self._decisions), ("/debug/state", self._state)])
        self.recent = recent
        self.state = state

    async def _decisions(self, request: web.Request) -> web.Response:
        try:
            n = int(request.query.get("n", str(DEFAULT_DECISIONS)))
        except ValueError:
            raise web.HTTPBadRequest(text="n must be an integer") from None
        decisions = self.recent(n)  # the ring keeps each decision's ranked head only: a few candidates each
        body = await off_loop(lambda: json.dumps([d.as_dict() for d in decisions], indent=1).encode())
        return web.Response(body=body, content_type="application/json", charset="utf-8")

    async def _state(self, _request: web.Request) -> web.Response:
        state = await self.state()
        # Encoded to bytes in the thread too: a 10,000-row page is megabytes of text.
        body = await off_loop(lambda: dumps_in_pieces(state).encode())
        return web.Response(body=body, content_type="application/json", charset="utf-8")
