"""Scrapes every engine's /metrics on an interval, each call time-boxed.

At most SCRAPE_CONCURRENCY scrapes are in flight at once, and a fleet larger than that is spread over
SPREAD_SHARE of the interval (engine i starts at i/N of it), so 10,000 engines are neither 10,000 sockets
at once nor one burst of parsing that holds the event loop (docs/architecture.md, "Fleet size")."""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp

from loadaware.fleet.engine_http import get_body
from loadaware.fleet.health import EndpointHealth
from loadaware.fleet.registry import EndpointRegistry
from loadaware.load.scraped import extras_of, table
from loadaware.load.tracker import EngineStats, LoadTracker
from loadaware.load.vllm_metrics import parse_vllm_gauges
from loadaware.telemetry.metrics import Metrics
from loadaware.telemetry.table_series import TableGauge

log = logging.getLogger(__name__)

SCRAPE_CONCURRENCY = 64
SPREAD_SHARE = 0.8  # of the interval: the rest is slack for the last scrapes' time-outs


class MetricsScraper:
    path = "/metrics"  # where vLLM serves its Prometheus page

    def __init__(self, registry: EndpointRegistry, loads: LoadTracker, metrics: Metrics,
                 interval_s: float, timeout_s: float, health: EndpointHealth | None = None) -> None:
        self.registry = registry
        self.health = health  # a scrape that times out or cannot connect says the engine is unreachable
        self.loads = loads
        self.metrics = metrics
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.rounds = 0  # completed scrape rounds (readiness waits for the first)
        self._session: aiohttp.ClientSession | None = None
        # The /metrics gauges of the registered signals beyond the core ones (load/scraped/), by signal name.
        self._extra_gauges: dict[str, TableGauge] = {
            s.name: metrics.scraped_signal(s.metric, f"Scraped {s.gauge}: {s.help}")
            for s in table().extras if s.metric}

    async def scrape_one(self, endpoint: str) -> bool:
        assert self._session is not None
        try:
            text = (await get_body(self._session, endpoint, self.path, self.timeout_s)).decode("utf-8", "replace")
        except TimeoutError:
            self._failed(endpoint, "timeout")
            self._unreachable(endpoint)
            return False
        except aiohttp.ClientConnectionError as exc:  # refused, reset, closed mid-answer
            log.debug("scrape of %s failed: %s", endpoint, exc)
            self._failed(endpoint, "connect")
            self._unreachable(endpoint)
            return False
        except Exception as exc:  # noqa: BLE001 - any failure only costs this endpoint's refinement
            log.debug("scrape of %s failed: %s", endpoint, exc)
            self._failed(endpoint, "error")
            if self.health is not None:
                self.health.scrape_ok(endpoint)  # it answered: reachable, whatever the answer
            return False
        if self.health is not None:
            self.health.scrape_ok(endpoint)
        return self.take(endpoint, text)

    def take(self, endpoint: str, text: str) -> bool:
        """Record `endpoint`'s page: every registered signal (load/scraped/) into the tracker and /metrics."""
        gauges = parse_vllm_gauges(text)
        if "running" not in gauges:
            self._failed(endpoint, "no_vllm_metrics")
            return False
        if endpoint not in self.registry:
            return False  # vanished while we waited
        stats = EngineStats(gauges.get("running", 0.0), gauges.get("waiting", 0.0), gauges.get("kv_usage"),
                            time.monotonic(), gauges.get("ttft_sum"), gauges.get("ttft_count"),
                            gauges.get("kv_capacity_tokens"), extras_of(gauges))
        self.loads.record(endpoint, stats)
        self.metrics.scraped(endpoint, stats.running, stats.waiting, stats.kv_usage)
        if stats.scraped:
            for name, value in stats.scraped.items():
                gauge = self._extra_gauges.get(name)
                if gauge is not None:
                    gauge.labels(endpoint).set(value)
        return True

    def _failed(self, endpoint: str, reason: str) -> None:
        if endpoint in self.registry:  # a departed endpoint's series are gone: do not bring one back
            self.metrics.scrape_failure(endpoint, reason)

    def _unreachable(self, endpoint: str) -> None:
        if self.health is not None and endpoint in self.registry:
            self.health.scrape_failed(endpoint)

    async def scrape_all(self) -> None:
        endpoints = self.registry.snapshot()
        if len(endpoints) <= SCRAPE_CONCURRENCY:
            if endpoints:
                await asyncio.gather(*(self.scrape_one(ep) for ep in endpoints))
        else:
            await self._paced(endpoints)
        self.rounds += 1

    async def _paced(self, endpoints: tuple[str, ...]) -> None:
        gate = asyncio.Semaphore(SCRAPE_CONCURRENCY)
        running: set[asyncio.Task[bool]] = set()
        started = time.monotonic()
        step = self.interval_s * SPREAD_SHARE / len(endpoints)

        async def one(endpoint: str) -> bool:
            try:
                return await self.scrape_one(endpoint)
            finally:
                gate.release()

        for i, endpoint in enumerate(endpoints):
            wait = started + i * step - time.monotonic()
            if wait > 0.002:  # sleep only when it is worth a wake-up: the rest start together
                await asyncio.sleep(wait)
            await gate.acquire()
            if endpoint not in self.registry:
                gate.release()
                continue  # left while the round was under way
            task = asyncio.create_task(one(endpoint))
            running.add(task)
            task.add_done_callback(running.discard)
        if running:
            await asyncio.gather(*running)

    async def run(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=None))
        try:
            while True:
                started = time.monotonic()
                await self.scrape_all()
                await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
        finally:
            await self._session.close()
