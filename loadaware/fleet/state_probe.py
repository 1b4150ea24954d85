"""Asking an engine whether it holds a stored response: `GET /v1/responses/{id}` (200: it does; 404: it does not).

vLLM answers from the dict of the process that made the response, so the engine that answers 200 is the one a
follow-up must reach (fleet/state_holders.py). One HTTP session for every probe, opened at the first.
"""

from __future__ import annotations

from urllib.parse import quote

import aiohttp

from loadaware.fleet.engine_http import get_status


class EngineStateProbe:
    def __init__(self, timeout_s: float = 0.5) -> None:
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, endpoint: str, response_id: str) -> bool:
        """Whether `endpoint` holds `response_id`; raises when it cannot tell (unreachable, 5xx, time-out)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        status = await get_status(self._session, endpoint, "/v1/responses/" + quote(response_id, safe=""),
                                  self.timeout_s)
        if status == 200:
            return True
        if status == 404:
            return False
        raise RuntimeError(f"HTTP {status}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
