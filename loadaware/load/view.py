"""Per-endpoint load as the policies see it: own in-flight counts refined by scraped engine metrics.

load(i) = max(inflight(i), running(i) + waiting(i) + correction(i))   with a fresh scrape
load(i) = inflight(i)                                               otherwise

correction(i) = own requests decided since the scrape and still open - own requests the scrape counted
that have ended since. The scrape sees traffic from other gateway replicas; the correction keeps a burst
decided on one snapshot from herding onto one engine (DESIGN.md §5) and lets a finished request stop
weighing at once. A stale scrape is ignored.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from loadaware.load.inflight import InflightTracker


@dataclass(frozen=True, slots=True)
class EngineStats:
    running: float
    waiting: float
    kv_usage: float | None
    at: float  # monotonic time of the scrape


class LoadView:
    def __init__(self, inflight: InflightTracker, stale_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inflight = inflight
        self.stale_s = stale_s
        self.clock = clock
        self._stats: dict[str, EngineStats] = {}

    def record(self, endpoint: str, stats: EngineStats) -> None:
        self._stats[endpoint] = stats
        self.inflight.mark_snapshot(endpoint)

    def drop(self, endpoint: str) -> None:
        self._stats.pop(endpoint, None)

    def stats(self, endpoint: str) -> EngineStats | None:
        return self._stats.get(endpoint)

    def fresh_stats(self, endpoint: str, now: float | None = None) -> EngineStats | None:
        stats = self._stats.get(endpoint)
        if stats is None:
            return None
        now = self.clock() if now is None else now
        return stats if now - stats.at <= self.stale_s else None

    def load(self, endpoint: str, now: float) -> float:
        own = self.inflight.count(endpoint)
        stats = self._stats.get(endpoint)
        if stats is None or now - stats.at > self.stale_s:
            return float(own)
        scraped = stats.running + stats.waiting + self.inflight.snapshot_correction(endpoint)
        return float(own) if own > scraped else scraped

    def loads(self, endpoints: tuple[str, ...]) -> list[float]:
        now = self.clock()
        return [self.load(ep, now) for ep in endpoints]
