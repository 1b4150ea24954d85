"""Fetches every engine's `GET /v1/models` on an interval, and at once for endpoints discovery just added
(the registry's `added` event wakes it).

Engines are reached at the endpoint's own ip:port (as the metrics scraper does), each call time-boxed. A
failed fetch keeps the last good list (the store ages it out) and is counted; it never blocks routing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import aiohttp

from loadaware.fleet.engine_http import get_body
from loadaware.fleet.models import EndpointModels, parse_models
from loadaware.fleet.registry import EndpointRegistry
from loadaware.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

FETCH_CONCURRENCY = 64


class ModelsPoller:
    def __init__(self, registry: EndpointRegistry, store: EndpointModels, metrics: Metrics, interval_s: float,
                 timeout_s: float, path: str = "/v1/models") -> None:
        self.registry = registry
        self.store = store
        self.metrics = metrics
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.path = path
        self.rounds = 0  # completed full rounds
        self._tried: set[str] = set()  # endpoints fetched at least once since they (re)joined
        self._asked: set[str] = set()  # ... and whose first fetch has finished (answered or failed)
        self._session: aiohttp.ClientSession | None = None
        self._arrived = asyncio.Event()  # discovery added endpoints not fetched yet
        registry.subscribe(self)

    # ---- the registry's events ----
    def on_added(self, endpoint: str) -> None:
        self._arrived.set()

    def on_removed(self, endpoint: str) -> None:
        self._tried.discard(endpoint)  # one that returns is new again
        self._asked.discard(endpoint)

    def on_changed(self, endpoints: tuple[str, ...]) -> None:
        pass

    def asked(self, endpoints: tuple[str, ...]) -> bool:
        """Every one of `endpoints` has been asked once (readiness: until then its model is not known)."""
        return all(ep in self._asked for ep in endpoints)

    async def fetch_one(self, endpoint: str) -> bool:
        if endpoint not in self.registry:
            return False  # left before its turn came
        self._tried.add(endpoint)
        try:
            return await self._fetch_one(endpoint)
        finally:
            if endpoint in self._tried:  # still a member (on_removed forgets it): no entry for a departed one
                self._asked.add(endpoint)

    async def _fetch_one(self, endpoint: str) -> bool:
        assert self._session is not None
        try:
            models = parse_models(json.loads(await get_body(self._session, endpoint, self.path, self.timeout_s)))
        except TimeoutError:
            self._failed(endpoint, "timeout")
            return False
        except ValueError as exc:  # not JSON, or not a model list
            log.debug("models of %s unreadable: %s", endpoint, exc)
            self._failed(endpoint, "bad_body")
            return False
        except Exception as exc:  # noqa: BLE001 - a failure only costs this endpoint's filtering (fail open)
            log.debug("models fetch of %s failed: %s", endpoint, exc)
            self._failed(endpoint, "error")
            return False
        if endpoint not in self.registry:
            return False  # left while we waited: do not resurrect it
        self.store.record(endpoint, models)
        self.metrics.models_seen(endpoint, models.ids)
        return True

    def _failed(self, endpoint: str, reason: str) -> None:
        if endpoint in self.registry:  # a departed endpoint's series are gone: do not bring one back
            self.metrics.models_fetch_failure(endpoint, reason)

    async def fetch(self, endpoints: tuple[str, ...] | list[str]) -> None:
        gate = asyncio.Semaphore(FETCH_CONCURRENCY)  # 10,000 engines are not 10,000 sockets at once

        async def one(endpoint: str) -> None:
            async with gate:
                await self.fetch_one(endpoint)

        if endpoints:
            await asyncio.gather(*(one(ep) for ep in endpoints))

    async def run(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=None))
        try:
            next_round = 0.0
            while True:
                self._arrived.clear()
                fleet = self.registry.snapshot()
                if time.monotonic() >= next_round:
                    next_round = time.monotonic() + self.interval_s
                    await self.fetch(fleet)
                    self.rounds += 1
                else:
                    await self.fetch([ep for ep in fleet if ep not in self._tried])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), max(0.0, next_round - time.monotonic()))
        finally:
            await self._session.close()
