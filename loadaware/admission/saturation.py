"""When an engine has no room, from the signals the sidecar has (pure but for the reads it is given).

    queue(i) = waiting(i) + own_since(i)    if the last fresh scrape of i showed waiting(i) > 0
    room(i)  = max(0, bound - queue(i))     if it showed waiting(i) = 0: room(i) = bound
    room(i)  = unbounded                     without a fresh scrape (unknown: fail open)
    saturated(i) = room(i) = 0;  the pool is saturated when every eligible endpoint is

waiting(i): the engine's admission queue as last scraped (vllm:num_requests_waiting). own_since(i): this
sidecar's requests sent to i since that scrape less those that ended since (the load tracker's correction):
when the engine was queueing at the scrape, every request sent since joined its queue. When it was not, the
requests sent since went into free batch slots (how many the engine has is not on its page), so its room
stays `bound` until a scrape shows a queue. bound: --saturation-queue.

So the sidecar holds a request only when every engine already queues at least `bound` requests of its own: an
engine queue is where a request waits without a priority, a fairness turn or a later, better placement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable
from typing import Protocol


class Scraped(Protocol):
    @property
    def waiting(self) -> float: ...


class LoadSignals(Protocol):
    def fresh_stats(self, endpoint: str, now: float | None = None) -> Scraped | None: ...

    def snapshot_correction(self, endpoint: str) -> int: ...


def room(waiting: float | None, own_since: int, bound: int) -> float:
    """An engine's room (see the module's formula); waiting None: no fresh scrape."""
    if waiting is None:
        return math.inf
    if waiting <= 0:
        return float(bound)
    return float(max(0.0, bound - (waiting + own_since)))


class PoolRoom:
    """The eligible endpoints' room, read from the load tracker's scrapes and own counts."""

    def __init__(self, signals: LoadSignals, endpoints: Callable[[], Iterable[str]],
                 excluded: Callable[[], Collection[str]], bound: int) -> None:
        self.signals = signals
        self.endpoints = endpoints  # the fleet
        self.excluded = excluded  # engines failing their requests (few): not eligible
        self.bound = bound

    def of(self, endpoint: str) -> float:
        stats = self.signals.fresh_stats(endpoint)
        if stats is None:
            return math.inf
        return room(stats.waiting, self.signals.snapshot_correction(endpoint), self.bound)

    def has_room(self) -> bool:
        """Is any eligible endpoint not saturated? Stops at the first that is not (the common case is cheap)."""
        out = self.excluded()
        seen = False
        for endpoint in self.endpoints():
            if endpoint in out:
                continue
            seen = True
            if self.of(endpoint) > 0:
                return True
        return not seen  # no eligible endpoint: nothing to wait for (the decision answers that)

    def total(self) -> float:
        """The room of every eligible endpoint together (unbounded if any has no fresh scrape)."""
        out = self.excluded()
        total = 0.0
        seen = False
        for endpoint in self.endpoints():
            if endpoint in out:
                continue
            seen = True
            total += self.of(endpoint)
            if total == math.inf:
                return total
        return total if seen else math.inf

    def saturation(self) -> float:
        """The share of eligible endpoints that are saturated (0..1; the pool is saturated at 1)."""
        out = self.excluded()
        n = full = 0
        for endpoint in self.endpoints():
            if endpoint in out:
                continue
            n += 1
            full += self.of(endpoint) <= 0
        return full / n if n else 0.0
