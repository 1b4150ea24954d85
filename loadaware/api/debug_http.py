"""The sidecar's HTTP port: /metrics for Prometheus, /debug/decisions and /debug/state for people.

/debug/decisions renders decisions without prompt text or token ids (Decision.as_dict carries neither).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from loadaware.lifecycle import Decision

DEFAULT_DECISIONS = 50


class DebugHttp:
    def __init__(self, render_metrics: Callable[[], bytes], recent: Callable[[int], list[Decision]],
                 state: Callable[[], dict[str, Any]]) -> None:
        self.render_metrics = render_metrics
        self.recent = recent
        self.state = state
        self.runner: web.AppRunner | None = None

    async def start(self, listen: str) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/debug/decisions", self._decisions)
        app.router.add_get("/debug/state", self._state)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        host, _, port = listen.rpartition(":")
        await web.TCPSite(self.runner, host.strip("[]"), int(port)).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.render_metrics(), content_type="text/plain", charset="utf-8")

    async def _decisions(self, request: web.Request) -> web.Response:
        try:
            n = int(request.query.get("n", str(DEFAULT_DECISIONS)))
        except ValueError:
            raise web.HTTPBadRequest(text="n must be an integer") from None
        items = [d.as_dict() for d in self.recent(n)]
        return web.json_response(items, dumps=lambda o: json.dumps(o, indent=1))

    async def _state(self, _request: web.Request) -> web.Response:
        return web.json_response(self.state())
