"""When an engine has no room, from the signals the sidecar has (pure but for the reads it is given).

    holds(i) = max(own(i), running(i) + waiting(i) + own_since(i))
                                                         the requests engine i has, as far as the sidecar knows
    slots(i) = running(i) at its last scrape that showed a queue (waiting > 0), raised by any scrape that shows
               more running without one                  its batch capacity, learned: vLLM's max_num_seqs, or
                                                         fewer when its KV cache is the limit
    room(i)  = max(0, slots(i) + queue - holds(i))           once slots(i) is known
    room(i)  = unbounded while i has not queued yet (waiting 0), or has no fresh scrape (fail open)
    room(i)  = max(0, queue - waiting(i) - own_since(i))      queueing, before its slots are known
    saturated(i) = room(i) <= reserve;   the pool is saturated when every eligible endpoint is

running, waiting: vllm:num_requests_running / _waiting as last scraped. own_since(i): this sidecar's requests
sent to i since that scrape less those that ended since (the load tracker's correction). own(i): this sidecar's
requests in flight on i. The scrape plus its correction errs on the light side twice over: a request that ended
at the engine before the scrape but whose end reached the sidecar after it is subtracted though the scrape no
longer counts it, and one still on its way to the engine at the scrape is counted nowhere. While lower bands
are held, every request of room seen in error is taken at once and the top band's reserved slot is gone
(docs/results.md, "Admission under saturation"); the sidecar's own count errs on the heavy side (an end is heard
after the engine finished), so the larger of the two is what an engine holds. queue:
--saturation-queue, the requests an engine may queue beyond its batch (0: none; a request waits where it can
still be released by priority and placed later). reserve: the slots an engine keeps for the highest priority
the objectives define (--reserved-slots N; 0 for that priority itself, and under auto, whose reserve is over the
pool: reserve.py), so that its requests find a free slot while lower ones are held.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Protocol


class Scraped(Protocol):
    @property
    def running(self) -> float: ...

    @property
    def waiting(self) -> float: ...

    @property
    def at(self) -> float: ...


class LoadSignals(Protocol):
    def fresh_stats(self, endpoint: str, now: float | None = None) -> Scraped | None: ...

    def snapshot_correction(self, endpoint: str) -> int: ...

    def count(self, endpoint: str) -> int: ...


def room(running: float, waiting: float, own_since: int, slots: float | None, queue: int, own: int = 0) -> float:
    """An engine's room (see the module's formula)."""
    if slots is None:
        if waiting <= 0:
            return math.inf
        return float(max(0.0, queue - waiting - own_since))
    return float(max(0.0, slots + queue - max(own, running + waiting + own_since)))


def learn_slots(known: float | None, running: float, waiting: float) -> float | None:
    """An engine's batch capacity after a scrape: what ran while some waited, or more if more ran since."""
    if waiting > 0 and running > 0:
        return running
    if known is not None and running > known:
        return running
    return known


class PoolRoom:
    """The eligible endpoints' room, read from the load tracker's scrapes and own counts."""

    def __init__(self, signals: LoadSignals, endpoints: Callable[[], Iterable[str]],
                 excluded: Callable[[], Collection[str]], queue: int) -> None:
        self.signals = signals
        self.endpoints = endpoints  # the fleet
        self.excluded = excluded  # engines failing their requests (few): not eligible
        self.queue = queue
        self.slots: dict[str, float] = {}  # endpoint -> its learned batch capacity (bounded by the fleet)

    def scraped(self, endpoint: str, running: float, waiting: float) -> None:
        """A scrape of `endpoint` (the load tracker's listener): its batch capacity may be learned."""
        slots = learn_slots(self.slots.get(endpoint), running, waiting)
        if slots is not None:
            self.slots[endpoint] = slots
            if len(self.slots) > 64 and len(self.slots) > 2 * len(members := set(self.endpoints())):
                self.slots = {ep: n for ep, n in self.slots.items() if ep in members}  # departed engines go

    def of(self, endpoint: str) -> float:
        stats = self.signals.fresh_stats(endpoint)
        if stats is None:
            return math.inf
        return room(stats.running, stats.waiting, self.signals.snapshot_correction(endpoint),
                    self.slots.get(endpoint), self.queue, self.signals.count(endpoint))

    def views(self, limit: int, now: float) -> list[dict[str, object]]:
        """The room formula's inputs and result for the first `limit` eligible endpoints, as of `now` (the
        tracker's clock): what a top-band hold keeps (top_holds.py)."""
        rows: list[dict[str, object]] = []
        for endpoint in self._eligible():
            if len(rows) >= limit:
                break
            stats = self.signals.fresh_stats(endpoint, now)
            free = self.of(endpoint)
            rows.append({"endpoint": endpoint, "slots": self.slots.get(endpoint),
                         "running": None if stats is None else stats.running,
                         "waiting": None if stats is None else stats.waiting,
                         "scraped_ago_s": None if stats is None else round(now - stats.at, 4),
                         "own": self.signals.count(endpoint),
                         "own_since": self.signals.snapshot_correction(endpoint),
                         "room": None if free == math.inf else free})
        return rows

    def _eligible(self) -> Iterator[str]:
        out = self.excluded()
        return (endpoint for endpoint in self.endpoints() if endpoint not in out)

    def known_slots(self) -> float:
        """The eligible endpoints' learned batch capacities, together (0 while none is known)."""
        slots = self.slots
        return sum(slots.get(endpoint, 0.0) for endpoint in self._eligible())

    def eligible_count(self) -> int:
        return sum(1 for _ in self._eligible())

    def has_room(self, reserve: int = 0) -> bool:
        """Is any eligible endpoint's room above `reserve`? Stops at the first (the common case is cheap)."""
        seen = False
        for endpoint in self._eligible():
            seen = True
            if self.of(endpoint) > reserve:
                return True
        return not seen  # no eligible endpoint: nothing to wait for (the decision answers that)

    def total(self, reserve: int = 0) -> float:
        """The eligible endpoints' room beyond `reserve` each, together (unbounded if any has no bound)."""
        total = 0.0
        seen = False
        for endpoint in self._eligible():
            seen = True
            total += max(0.0, self.of(endpoint) - reserve)
            if total == math.inf:
                return total
        return total if seen else math.inf

    def saturation(self) -> float:
        """The share of eligible endpoints with no room (0..1; at 1 every request is held)."""
        n = full = 0
        for endpoint in self._eligible():
            n += 1
            full += self.of(endpoint) <= 0
        return full / n if n else 0.0
