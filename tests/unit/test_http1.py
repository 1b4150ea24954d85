"""The lean keep-alive client against a real aiohttp server on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from loadaware.prefix.lmcache.http1 import KeepAliveClient
from tests.conftest import wait_until_async


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, int, dict[str, int]]]:
    seen = {"requests": 0}

    async def echo(request: web.Request) -> web.Response:
        seen["requests"] += 1
        return web.Response(body=b"len=" + str(len(await request.read())).encode())

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in (b'{"a":', b" 1", b"}"):
            await resp.write(part)
        await resp.write_eof()
        return resp

    async def close(request: web.Request) -> web.Response:
        return web.Response(body=b"bye", headers={"Connection": "close"})

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)
        return web.Response(body=b"late")

    async def fail(request: web.Request) -> web.Response:
        return web.Response(status=500, body=b"boom")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    for path, handler in (("/echo", echo), ("/chunked", chunked), ("/close", close), ("/slow", slow), ("/fail", fail)):
        app.router.add_post(path, handler)
    runner = web.AppRunner(app, keepalive_timeout=0.3)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield "127.0.0.1", port, seen
    await runner.cleanup()


async def wait_idle_connections_dropped(client: KeepAliveClient, count: int) -> None:
    """Until the server (keepalive_timeout=0.3 s) has closed every pooled connection: a fixed sleep would
    race the server's timer on a busy machine."""
    await wait_until_async(lambda: len(client._idle) == count and all(c.closed for c in client._idle),
                           message=f"the server to close the {count} idle keep-alive connection(s)")


async def test_keep_alive_reuse_and_bodies(server: tuple[str, int, dict[str, int]]) -> None:
    host, port, seen = server
    client = KeepAliveClient(host, port)
    for size in (0, 10, 200_000):
        assert await client.post("/echo", b"x" * size) == (200, f"len={size}".encode())
    assert len(client._idle) == 1  # one connection served all three
    assert await client.post("/chunked", b"") == (200, b'{"a": 1}')
    assert await client.post("/fail", b"") == (500, b"boom")
    assert seen["requests"] == 3
    client.close()


async def test_connection_close_and_server_side_idle_close(server: tuple[str, int, dict[str, int]]) -> None:
    host, port, _ = server
    client = KeepAliveClient(host, port)
    assert await client.post("/close", b"") == (200, b"bye")
    assert client._idle == []
    assert await client.post("/echo", b"abc") == (200, b"len=3")
    await wait_idle_connections_dropped(client, 1)
    assert await client.post("/echo", b"abcd") == (200, b"len=4")  # retried on a fresh connection
    client.close()


async def test_many_stale_idle_connections_after_a_lull(server: tuple[str, int, dict[str, int]]) -> None:
    host, port, _ = server
    client = KeepAliveClient(host, port)
    await asyncio.gather(*(client.post("/echo", b"x") for _ in range(4)))  # concurrency pools 4 connections
    assert len(client._idle) == 4
    await wait_idle_connections_dropped(client, 4)  # the server closes every idle one
    assert await client.post("/echo", b"abcde") == (200, b"len=5")  # not "no usable connection"
    client.close()


async def test_timeout_discards_the_connection(server: tuple[str, int, dict[str, int]]) -> None:
    host, port, _ = server
    client = KeepAliveClient(host, port)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await client.post("/slow", b"")
    assert client._idle == []
    assert await client.post("/echo", b"") == (200, b"len=0")
    client.close()


async def test_refused() -> None:
    from testkit.ports import free_port

    client = KeepAliveClient("127.0.0.1", free_port())
    with pytest.raises(OSError):
        await client.post("/x", b"")
