"""A large fleet's scrape round: at most SCRAPE_CONCURRENCY in flight, starts spread over the interval, every
engine scraped once, and an endpoint that leaves mid-round is not scraped; a small fleet is scraped at once."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from loadaware.fleet.registry import EndpointRegistry
from loadaware.load import scraper as scraper_module
from loadaware.load.scraper import SCRAPE_CONCURRENCY, SPREAD_SHARE, MetricsScraper
from loadaware.load.tracker import LoadTracker
from loadaware.telemetry.metrics import Metrics

PAGE = b'vllm:num_requests_running{model_name="m"} 2.0\nvllm:num_requests_waiting{model_name="m"} 1.0\n'


class Engines:
    """Stands in for the engines' /metrics: records when each call started and how many overlap."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.started: dict[str, float] = {}
        self.in_flight = 0
        self.most = 0

    async def get_body(self, session: aiohttp.ClientSession, endpoint: str, path: str, timeout_s: float) -> bytes:
        self.started[endpoint] = time.monotonic()
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(self.latency_s)
            return PAGE
        finally:
            self.in_flight -= 1


def rig(n: int, monkeypatch: pytest.MonkeyPatch, latency_s: float, interval_s: float
        ) -> tuple[MetricsScraper, Engines, EndpointRegistry, LoadTracker]:
    engines = Engines(latency_s)
    monkeypatch.setattr(scraper_module, "get_body", engines.get_body)
    registry = EndpointRegistry([f"10.1.{i // 250}.{i % 250 + 1}:8000" for i in range(n)])
    loads = LoadTracker(stale_s=10)
    scraper = MetricsScraper(registry, loads, Metrics("loadaware"), interval_s, timeout_s=1.0)
    return scraper, engines, registry, loads


async def test_a_large_fleet_is_scraped_spread_out_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    n, interval = 400, 0.5
    scraper, engines, registry, loads = rig(n, monkeypatch, latency_s=0.05, interval_s=interval)
    scraper._session = object()  # type: ignore[assignment]  # get_body is replaced: no session is used
    leaving = registry.snapshot()[-1]

    async def leave_mid_round() -> None:
        await asyncio.sleep(interval * SPREAD_SHARE / 2)
        registry.set(registry.snapshot()[:-1])

    started = time.monotonic()
    await asyncio.gather(scraper.scrape_all(), leave_mid_round())
    assert scraper.rounds == 1
    assert 1 < engines.most <= SCRAPE_CONCURRENCY
    assert set(engines.started) == set(registry.snapshot()) and leaving not in engines.started
    first, last = min(engines.started.values()), max(engines.started.values())
    # Starts spread over SPREAD_SHARE of the interval (engine i at i/n of it), not a burst at the start.
    assert last - first >= interval * SPREAD_SHARE * 0.8
    assert first - started < 0.05
    assert all(loads.stats(ep) is not None for ep in registry.snapshot())


async def test_a_small_fleet_is_scraped_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    scraper, engines, _, _ = rig(SCRAPE_CONCURRENCY, monkeypatch, latency_s=0.05, interval_s=5.0)
    scraper._session = object()  # type: ignore[assignment]
    await scraper.scrape_all()
    assert engines.most == SCRAPE_CONCURRENCY
    assert max(engines.started.values()) - min(engines.started.values()) < 0.05


async def test_a_scrape_carries_the_engines_ttft_histogram_totals(monkeypatch: pytest.MonkeyPatch) -> None:
    page = PAGE + (b'vllm:time_to_first_token_seconds_count{model_name="m"} 12.0\n'
                   b'vllm:time_to_first_token_seconds_sum{model_name="m"} 3.5\n')

    async def one_page(session: aiohttp.ClientSession, endpoint: str, path: str, timeout_s: float) -> bytes:
        return page

    scraper, _, registry, loads = rig(1, monkeypatch, latency_s=0.0, interval_s=1.0)
    monkeypatch.setattr(scraper_module, "get_body", one_page)
    scraper._session = object()  # type: ignore[assignment]
    await scraper.scrape_all()
    stats = loads.stats(registry.snapshot()[0])
    assert stats is not None and (stats.running, stats.ttft_sum, stats.ttft_count) == (2.0, 3.5, 12.0)
