"""The load tracker: in-flight leases, the scraped-load refinement, and the lifecycle events that drive it."""

from __future__ import annotations

import logging

import pytest

from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.load.tracker import EngineStats, LoadTracker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lease_release_is_idempotent() -> None:
    t = LoadTracker(stale_s=5.0)
    a, b = t.acquire("e1"), t.acquire("e1")
    assert t.count("e1") == 2
    t.release(a)
    t.release(a)
    t.release(None)
    assert t.count("e1") == 1
    t.release(b)
    assert t.count("e1") == 0 and t.total() == 0


def test_dropped_endpoint_leases_become_noops() -> None:
    t = LoadTracker(stale_s=5.0)
    old = t.acquire("e1")
    t.drop("e1")
    assert t.count("e1") == 0
    new = t.acquire("e1")  # the endpoint came back
    t.release(old)  # must not eat the new request's count
    assert t.count("e1") == 1
    t.release(new)
    assert t.count("e1") == 0


def test_scraped_load_with_own_corrections() -> None:
    clock = Clock()
    t = view = LoadTracker(stale_s=5.0, clock=clock)
    before = t.acquire("e1")
    view.record("e1", EngineStats(running=10, waiting=2, kv_usage=0.5, at=clock.now))
    # the scrape (12) already includes `before`; nothing decided since
    assert view.loads(("e1",)) == [12.0]
    burst = [t.acquire("e1") for _ in range(3)]  # decided since the snapshot: the scrape cannot see them
    assert view.loads(("e1",)) == [15.0]
    t.release(burst[0])  # one of them finished
    assert view.loads(("e1",)) == [14.0]
    t.release(before)  # a request the scrape counted has ended
    assert view.loads(("e1",)) == [13.0]
    clock.now += 6  # stale: only our own count remains
    assert view.loads(("e1",)) == [2.0]


def test_own_count_is_a_floor_and_unscraped_endpoints_use_it() -> None:
    clock = Clock()
    t = view = LoadTracker(stale_s=5.0, clock=clock)
    for _ in range(4):
        t.acquire("e1")
    view.record("e1", EngineStats(running=1, waiting=0, kv_usage=None, at=clock.now))
    assert view.loads(("e1", "e2")) == [4.0, 0.0]


def _decision(endpoint: str | None) -> Decision:
    return Decision("r", endpoint, "routed", (), 0, (), (), {}, 0.0)


def test_lifecycle_events_drive_the_counts_and_the_scrape_correction() -> None:
    clock = Clock()
    tracker = LoadTracker(stale_s=5.0, clock=clock)
    lifecycle = RequestLifecycle()
    lifecycle.subscribe(tracker)
    tracker.record("e1", EngineStats(running=3, waiting=0, kv_usage=None, at=clock.now))
    tracker.record("e2", EngineStats(running=3, waiting=0, kv_usage=None, at=clock.now))
    d = _decision("e1")
    lifecycle.decided(d)
    assert tracker.loads(("e1", "e2")) == [4.0, 3.0]  # decided after the scrape: added to it
    lifecycle.served(d, "e2")  # a retry sent it to e2: the load moves with it
    assert tracker.loads(("e1", "e2")) == [3.0, 4.0] and tracker.snapshot() == {"e1": 0, "e2": 1}
    lifecycle.ended(d)
    assert tracker.loads(("e1", "e2")) == [3.0, 3.0] and tracker.total() == 0
    unrouted = _decision(None)  # Envoy's fallback picks: nothing to count
    lifecycle.decided(unrouted)
    lifecycle.ended(unrouted)
    assert unrouted.lease is None and tracker.total() == 0


def test_dropping_an_endpoint_forgets_its_stats_too() -> None:
    clock = Clock()
    tracker = LoadTracker(stale_s=5.0, clock=clock)
    tracker.record("e1", EngineStats(running=9, waiting=1, kv_usage=0.5, at=clock.now))
    tracker.drop("e1")
    assert tracker.stats("e1") is None and tracker.loads(("e1",)) == [0.0]


def test_scrape_listeners_hear_every_recorded_scrape_and_a_failing_one_costs_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    tracker = LoadTracker(stale_s=5, clock=clock)
    heard: list[tuple[str, EngineStats]] = []

    def broken(endpoint: str, stats: EngineStats) -> None:
        raise RuntimeError("listener bug")

    tracker.subscribe_scrapes(broken)
    tracker.subscribe_scrapes(lambda ep, st: heard.append((ep, st)))
    stats = EngineStats(running=4, waiting=1, kv_usage=None, at=clock.now, ttft_sum=2.0, ttft_count=8.0)
    with caplog.at_level(logging.ERROR, logger="loadaware.load.tracker"):
        tracker.record("e1", stats)
        for i in range(2, 30):  # a scrape of every endpoint every interval: the broken listener fails on each
            tracker.record(f"e{i}", stats)
    assert heard[0] == ("e1", stats) and len(heard) == 29
    assert tracker.load("e1", clock.now) == 5  # the scrape counted all the same
    assert len(caplog.records) == 1  # one traceback per listener per interval, not one per scrape


def test_the_queueing_set_follows_fresh_scrapes_with_a_queue() -> None:
    now = [100.0]
    t = LoadTracker(stale_s=2.0, clock=lambda: now[0])
    for ep in ("a", "b", "c"):
        t.join(ep)
    t.record("a", EngineStats(64, 3, None, now[0]))
    t.record("b", EngineStats(64, 1, None, now[0]))
    t.record("c", EngineStats(10, 0, None, now[0]))
    assert t.queueing == {"a", "b"}
    t.record("b", EngineStats(60, 0, None, now[0]))  # its queue drained
    assert t.queueing == {"a"}
    now[0] += 1.5
    t.record("c", EngineStats(64, 2, None, now[0]))
    assert t.queueing == {"a", "c"}
    now[0] += 1.0  # a's scrape is 2.5 s old: stale once the order is asked for
    t.ordered()
    assert t.queueing == {"c"} and t.fresh_stats("a") is None
    t.drop("c")
    assert t.queueing == set()
