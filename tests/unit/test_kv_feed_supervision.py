"""Each engine's KV-event feed runs under the supervisor: a feed that crashes clears its engine's credit and
starts again after a backoff, counted under one series; an engine that leaves takes its feed with it."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from loadaware.fleet.addresses import FeedAddress
from loadaware.prefix.blocks import BlockIndex
from loadaware.prefix.kvevents.feeds import FEED_SERIES, EngineFeed, FeedOptions, KvEventsFeeds
from loadaware.tasks.supervisor import Supervisor, SupervisorOptions
from loadaware.telemetry.metrics import Metrics
from tests.conftest import wait_until_async

EP = "127.0.0.61:8000"


async def test_a_crashing_feed_is_reset_and_restarted_with_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[EngineFeed] = []
    resets: list[str] = []

    async def broken(self: EngineFeed) -> None:
        runs.append(self)
        self.connected = self.synced = True  # as if it had joined before the bad data came
        raise ValueError("undecodable event")

    monkeypatch.setattr(EngineFeed, "run", broken)
    monkeypatch.setattr(EngineFeed, "reset", lambda self, reason: resets.append(reason))
    registry = CollectorRegistry()
    supervisor = Supervisor(registry, SupervisorOptions(base_s=0.01, max_s=0.04, failing_after=3, stable_s=5))
    endpoints = [EP]
    feeds = KvEventsFeeds(BlockIndex(), Metrics("loadaware"), lambda: tuple(endpoints),
                          FeedOptions({EP: FeedAddress("tcp://127.0.0.61:1", None)}), spawn=supervisor.spawn)
    manager = asyncio.create_task(feeds.run())
    try:
        await wait_until_async(lambda: len(runs) >= 4, message="the feed restarted after each crash")
        assert resets[:3] == ["feed_error"] * 3 and not runs[-1].connected and not runs[-1].synced
        restarts = registry.get_sample_value("loadaware_task_restarts_total", {"task": FEED_SERIES})
        assert restarts is not None and restarts >= 3
        feeds.remove(EP)  # the engine left: its feed goes, and the supervisor forgets it
        await asyncio.sleep(0.1)
        assert not any(row["task"].startswith("kv-events-feed") for row in supervisor.state())
        settled = len(runs)
        await asyncio.sleep(0.1)
        assert len(runs) == settled  # no restart after removal
    finally:
        manager.cancel()
        await asyncio.gather(manager, return_exceptions=True)
        await supervisor.stop()
