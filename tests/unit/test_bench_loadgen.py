"""The open-loop load generator against a local aiohttp server (no Envoy)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from aiohttp import web

from bench.loadgen import LoadResult, LoadSpec, run_load


async def _serve_and_load(spec_for: Callable[[str], LoadSpec]) -> tuple[LoadResult, list[bytes]]:
    seen: list[bytes] = []

    async def ok(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.json_response({"ok": True})

    async def teapot(request: web.Request) -> web.Response:
        return web.Response(status=418)

    app = web.Application()
    app.router.add_post("/ok", ok)
    app.router.add_get("/teapot", teapot)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        result = await run_load(spec_for(f"http://127.0.0.1:{port}"))
    finally:
        await runner.cleanup()
    return result, seen


def test_loadgen_counts_latencies_and_bodies() -> None:
    def spec(base: str) -> LoadSpec:
        return LoadSpec(url=f"{base}/ok", rate=100, duration=1.0, arrivals="fixed", bodies=['{"a":1}', '{"b":2}'],
                        connections=8, timeout=5.0)

    result, seen = asyncio.run(_serve_and_load(spec))
    assert result.scheduled == 100 and result.sent == 100
    assert result.ok == 100 and result.errors == 0
    assert result.statuses == {"200": 100}
    # Relations that hold however slow the machine (no wall-clock window): a latency counts from the due time,
    # so it covers the actual send (asyncio may wake a timer up to its clock resolution early) and fits
    # within the run, which lasts past the last due time (0.99 s).
    assert len(result.latencies_s) == 100 and len(result.service_s) == 100
    assert all(0 < service <= latency + 1e-6 and latency <= result.wall_s
               for service, latency in zip(result.service_s, result.latencies_s))
    assert result.wall_s >= 0.99
    assert result.achieved_rate == pytest.approx(100 / max(1.0, result.wall_s))
    assert seen.count(b'{"a":1}') == 50 and seen.count(b'{"b":2}') == 50


def test_loadgen_reports_non_2xx_and_connection_errors() -> None:
    def spec(base: str) -> LoadSpec:
        return LoadSpec(url=f"{base}/teapot", method="GET", rate=50, duration=0.5, arrivals="fixed")

    result, _ = asyncio.run(_serve_and_load(spec))
    assert result.statuses == {"418": 25} and result.ok == 0 and result.errors == 25

    async def refused() -> LoadResult:
        from testkit.ports import free_port

        return await run_load(LoadSpec(url=f"http://127.0.0.1:{free_port()}/x", rate=20, duration=0.25,
                                       arrivals="fixed", timeout=2.0))

    r = asyncio.run(refused())
    assert r.ok == 0 and r.errors == 5
    assert all(k.startswith("error:") for k in r.statuses)
