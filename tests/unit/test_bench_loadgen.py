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
    return await _load_against(app, spec_for), seen


async def _load_against(app: web.Application, spec_for: Callable[[str], LoadSpec]) -> LoadResult:
    """Serve `app` on a free loopback port, run the load `spec_for(base_url)` against it, stop."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        return await run_load(spec_for(f"http://127.0.0.1:{port}"))
    finally:
        await runner.cleanup()


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


async def _serve_sse_and_load(spec_for: Callable[[str], LoadSpec]) -> LoadResult:
    """/sse streams 8 token events and [DONE], each written on its own after a short pause, one event split in
    two writes; /cut stops after 3 events (no [DONE]); /busy answers 503."""

    async def sse(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(8 if request.path == "/sse" else 3):
            event = b'data: {"choices":[{"text":" t%d"}]}\n\n' % i
            if i == 4:
                await resp.write(event[:5])
                await asyncio.sleep(0.002)
                event = event[5:]
            await resp.write(event)
            await asyncio.sleep(0.002)
        if request.path == "/sse":
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def busy(request: web.Request) -> web.Response:
        return web.json_response({"error": "busy"}, status=503)

    app = web.Application()
    app.router.add_post("/sse", sse)
    app.router.add_post("/cut", sse)
    app.router.add_post("/busy", busy)
    return await _load_against(app, spec_for)


def test_loadgen_streams_counts_events_and_times_the_first() -> None:
    def spec(base: str) -> LoadSpec:
        return LoadSpec(url=f"{base}/sse", rate=40, duration=0.5, arrivals="fixed", bodies=['{"stream":true}'],
                        connections=8, timeout=5.0, stream=True)

    r = asyncio.run(_serve_sse_and_load(spec))
    assert r.ok == 20 and r.errors == 0 and r.statuses == {"200": 20}
    assert r.sse_events == {"9": 20}
    # The first event arrives before the last byte: about 8 pauses of 2 ms separate them (at least 7 x 2 ms
    # by the server's sleeps, however slow the machine).
    assert len(r.ttft_s) == 20
    assert all(0 < t <= lat - 0.014 for t, lat in zip(r.ttft_s, r.latencies_s))


def test_loadgen_stream_without_done_is_an_error_and_non_200_is_not_parsed() -> None:
    def cut(base: str) -> LoadSpec:
        return LoadSpec(url=f"{base}/cut", rate=20, duration=0.25, arrivals="fixed", bodies=["{}"], stream=True)

    r = asyncio.run(_serve_sse_and_load(cut))
    assert r.statuses == {"error:truncated_stream": 5} and r.ok == 0 and r.ttft_s == [] and r.sse_events == {}

    def busy(base: str) -> LoadSpec:
        return LoadSpec(url=f"{base}/busy", rate=20, duration=0.25, arrivals="fixed", bodies=["{}"], stream=True)

    r = asyncio.run(_serve_sse_and_load(busy))
    assert r.statuses == {"503": 5} and r.errors == 5


def test_loadgen_without_stream_reports_no_stream_figures() -> None:
    def spec(base: str) -> LoadSpec:
        return LoadSpec(url=f"{base}/sse", rate=20, duration=0.25, arrivals="fixed", bodies=["{}"])

    r = asyncio.run(_serve_sse_and_load(spec))
    assert r.ok == 5 and r.ttft_s == [] and r.sse_events == {}


def test_loadgen_hangs_up_the_chosen_share_mid_request_and_numbers_unique_bodies() -> None:
    seen: list[bytes] = []
    aborted: list[int] = []

    async def slow(request: web.Request) -> web.Response:
        seen.append(await request.read())
        await asyncio.sleep(0.3)
        if request.transport is None or request.transport.is_closing():  # the client hung up meanwhile
            aborted.append(1)
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/slow", slow)

    def spec(base: str) -> LoadSpec:
        return LoadSpec(url=f"{base}/slow", rate=100, duration=1.0, arrivals="fixed", bodies=['{"n": "@N@"}'],
                        connections=64, timeout=5.0, hangup_fraction=0.2, hangup_within_s=0.2, unique_marker="@N@")

    result = asyncio.run(_load_against(app, spec))
    assert result.scheduled == 100 and result.hangups == 20 and result.statuses.get("hangup") == 20
    assert result.ok == 80 and result.errors == 0  # a hang-up is the client's choice, not an error
    assert len(aborted) == 20
    assert sorted(seen) == sorted(f'{{"n": "{i}"}}'.encode() for i in range(100))  # every body its own


def test_hangup_choice_is_seeded_and_sized() -> None:
    from bench.loadgen import hangup_delays

    a, b = hangup_delays(1000, 0.05, 0.1, seed=3), hangup_delays(1000, 0.05, 0.1, seed=3)
    assert a == b and len(a) == 50 and all(0 <= d < 0.1 for d in a.values())
    assert hangup_delays(1000, 0.0, 0.1, seed=3) == {}
