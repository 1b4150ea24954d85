"""One time-boxed GET to an engine's own HTTP port (its /metrics, its /v1/models): the body, or an error."""

from __future__ import annotations

import asyncio

import aiohttp

from loadaware.fleet.addresses import http_url


class EngineHttpError(RuntimeError):
    """The engine answered, with a status other than 200."""


async def get_body(session: aiohttp.ClientSession, endpoint: str, path: str, timeout_s: float) -> bytes:
    """Raises TimeoutError past `timeout_s`, aiohttp.ClientConnectionError when the engine cannot be reached
    (refused, reset, closed mid-answer), EngineHttpError for a non-200 answer."""
    async with asyncio.timeout(timeout_s):
        async with session.get(http_url(endpoint, path)) as resp:
            if resp.status != 200:
                raise EngineHttpError(f"HTTP {resp.status}")
            return await resp.read()


async def get_status(session: aiohttp.ClientSession, endpoint: str, path: str, timeout_s: float) -> int:
    """The HTTP status of a GET (the body is read and dropped); raises as get_body does but for a non-200."""
    async with asyncio.timeout(timeout_s):
        async with session.get(http_url(endpoint, path)) as resp:
            await resp.read()
            return resp.status
