"""/metrics over HTTP: a page larger than one slice goes out whole, in slices (the loop runs between them)."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from loadaware.api.debug_http import BODY_SLICE, MetricsHttp


async def fetch(page: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, str, int | None, list[int]]:
    """The page as a client reads it, and the size of each write the handler made (a whole response: none)."""
    async def render() -> bytes:
        return page

    writes: list[int] = []
    write = web.StreamResponse.write

    async def recorded(self: web.StreamResponse, data: bytes | bytearray | memoryview) -> None:
        writes.append(len(data))
        await write(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", recorded)
    site = MetricsHttp(render)
    port = await site.start("127.0.0.1:0")
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            body = await resp.read()
            return body, resp.headers["Content-Type"], resp.content_length, writes
    finally:
        await site.stop()


async def test_a_large_page_arrives_whole_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    page = b"".join(b'loadaware_x{endpoint="10.0.%d.%d:8000"} %d\n' % (i // 250, i % 250, i) for i in range(60_000))
    assert len(page) > 4 * BODY_SLICE
    body, content_type, length, writes = await fetch(page, monkeypatch)
    assert body == page and length == len(page)
    assert content_type == "text/plain; charset=utf-8"
    assert sum(writes) == len(page) and max(writes) == BODY_SLICE and len(writes) == -(-len(page) // BODY_SLICE)


async def test_a_small_page_is_one_response(monkeypatch: pytest.MonkeyPatch) -> None:
    body, content_type, length, _ = await fetch(b"up 1\n", monkeypatch)
    assert body == b"up 1\n" and length == 5 and content_type.startswith("text/plain")
