"""Per-endpoint load as the policies see it: the one owner of in-flight counts and scraped engine stats.

    load(i) = max(inflight(i), running(i) + waiting(i) + correction(i))   with a fresh scrape
    load(i) = inflight(i)                                               otherwise

inflight(i): requests this sidecar routed to i that have not ended. A request is counted the moment it is
decided (no await in between, or a burst decided meanwhile would not see it) and released exactly once
when it ends, however it ended; a leaked count would skew every later decision. Leases make the release
idempotent and survive an endpoint leaving in between.

correction(i): own requests decided since the last scrape and still open (the scrape cannot see them
yet: without this a burst decided on one snapshot herds onto one engine) minus own requests that scrape
counted which have ended since (without this a finished request weighs until the next scrape). The scrape
sees traffic of other gateway replicas too; a stale scrape is ignored.

The tracker listens to the request lifecycle (decided, served, ended); nothing else edits its state. It
also keeps every fleet endpoint's load in a `LoadOrder` (joined when discovery adds it), so a decision finds
the least-loaded endpoints and the fleet's mean load without visiting every endpoint; a scrape going stale
reorders its endpoint when the next question is asked.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from loadaware.lifecycle import Decision
from loadaware.load.order import LoadOrder
from loadaware.telemetry.faults import RateLimitedLog

log = logging.getLogger(__name__)
_quiet = RateLimitedLog(log)


@dataclass(frozen=True, slots=True)
class EngineStats:
    running: float
    waiting: float
    kv_usage: float | None
    at: float  # monotonic time of the scrape
    # The engine's TTFT histogram totals (vllm:time_to_first_token_seconds_sum / _count), None when absent:
    # the token-signal tracker learns each engine's mean TTFT from them (load/prefill_estimate.py).
    ttft_sum: float | None = None
    ttft_count: float | None = None
    # The engine's GPU KV cache in tokens (vllm:cache_config_info's num_gpu_blocks x block_size), None when
    # its page does not say.
    kv_capacity_tokens: float | None = None
    # Every registered signal beyond these core ones, by name (load/scraped/); None while none is registered.
    scraped: dict[str, float] | None = None


@dataclass(slots=True)
class Lease:
    endpoint: str
    generation: int  # the endpoint's generation when acquired: a removed-then-re-added endpoint starts fresh
    snapshot: int  # the endpoint's scrape epoch when acquired: was this request in the last scrape?
    released: bool = False


class LoadTracker:
    def __init__(self, stale_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_s = stale_s
        self.clock = clock
        self._counts: dict[str, int] = {}
        # endpoint -> its generation: a number never handed out before, so a lease from before the endpoint
        # left (and came back) never matches, and a departed endpoint's entry can go
        self._generation: dict[str, int] = {}
        self._generations = 0
        self._stats: dict[str, EngineStats] = {}
        self._capacity: dict[str, float] = {}  # endpoint -> its stated KV capacity in tokens
        self._fleet_capacity = 0.0  # their sum
        self._snapshot_epoch: dict[str, int] = {}
        self._started_after: dict[str, int] = {}
        self._ended_after: dict[str, int] = {}
        self._order = LoadOrder()  # fleet members only (join / drop)
        self._scraped_at: list[tuple[float, str]] = []  # (stats.at, endpoint): when each scrape goes stale
        # Endpoints whose last scrape, not yet expired, showed an admission queue (waiting > 0): current as of
        # the last expiry, which `ordered()` runs first. Mutated in place (a decider holds it).
        self.queueing: set[str] = set()
        self._scrape_listeners: list[Callable[[str, EngineStats], None]] = []

    # ---- the request lifecycle ----
    def on_decided(self, decision: Decision) -> None:
        if decision.endpoint is not None:
            decision.lease = self.acquire(decision.endpoint)

    def on_served(self, decision: Decision, previous: str | None) -> None:
        """Another engine served (a retry walked the list): the count moves with the request."""
        if decision.lease is None or decision.served is None:
            return
        self.release(decision.lease)
        decision.lease = self.acquire(decision.served)

    def on_ended(self, decision: Decision) -> None:
        self.release(decision.lease)

    # ---- counts ----
    def acquire(self, endpoint: str) -> Lease:
        self._counts[endpoint] = self._counts.get(endpoint, 0) + 1
        self._started_after[endpoint] = self._started_after.get(endpoint, 0) + 1
        self._reorder(endpoint)
        return Lease(endpoint, self._generation_of(endpoint), self._snapshot_epoch.get(endpoint, 0))

    def release(self, lease: Lease | None) -> None:
        if lease is None or lease.released:
            return
        lease.released = True
        ep = lease.endpoint
        if self._generation.get(ep) != lease.generation:
            return  # the endpoint was dropped (and maybe re-added) since: its counts were already reset
        count = self._counts.get(ep, 0)
        if count > 0:
            self._counts[ep] = count - 1
        if lease.snapshot == self._snapshot_epoch.get(ep, 0):
            self._started_after[ep] = max(0, self._started_after.get(ep, 0) - 1)
        else:
            self._ended_after[ep] = self._ended_after.get(ep, 0) + 1
        self._reorder(ep)

    def count(self, endpoint: str) -> int:
        return self._counts.get(endpoint, 0)

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)

    def total(self) -> int:
        return sum(self._counts.values())

    # ---- scraped stats ----
    def subscribe_scrapes(self, listener: Callable[[str, EngineStats], None]) -> None:
        """`listener(endpoint, stats)` after each recorded scrape (the token-signal tracker's TTFT counters)."""
        self._scrape_listeners.append(listener)

    def record(self, endpoint: str, stats: EngineStats) -> None:
        """A scrape of `endpoint` arrived: it starts a new snapshot epoch for the correction."""
        self._stats[endpoint] = stats
        if stats.waiting > 0:
            self.queueing.add(endpoint)
        else:
            self.queueing.discard(endpoint)
        if stats.kv_capacity_tokens is not None:
            self._fleet_capacity += stats.kv_capacity_tokens - self._capacity.get(endpoint, 0.0)
            self._capacity[endpoint] = stats.kv_capacity_tokens
        self._snapshot_epoch[endpoint] = self._snapshot_epoch.get(endpoint, 0) + 1
        self._started_after[endpoint] = 0
        self._ended_after[endpoint] = 0
        heapq.heappush(self._scraped_at, (stats.at, endpoint))
        if len(self._scraped_at) > 2 * len(self._stats) + 64:  # departed endpoints' entries: rebuild
            self._scraped_at = [(st.at, ep) for ep, st in self._stats.items()]
            heapq.heapify(self._scraped_at)
        self._expire(self.clock())
        self._reorder(endpoint)
        for listener in self._scrape_listeners:
            try:
                listener(endpoint, stats)
            except Exception as exc:  # noqa: BLE001 - a listener's failure never costs the scrape its load figures
                # once per scrape of every endpoint: one traceback per listener per interval, not per scrape
                _quiet.log(logging.ERROR, f"scrape listener {listener!r}", "scrape listener %r failed", listener,
                           exc_info=exc)

    def stats(self, endpoint: str) -> EngineStats | None:
        return self._stats.get(endpoint)

    def fresh_stats(self, endpoint: str, now: float | None = None) -> EngineStats | None:
        stats = self._stats.get(endpoint)
        if stats is None:
            return None
        now = self.clock() if now is None else now
        return stats if now - stats.at <= self.stale_s else None

    def snapshot_correction(self, endpoint: str) -> int:
        """Own requests to add to the last scraped load: started since it and open, minus ended since it."""
        return self._started_after.get(endpoint, 0) - self._ended_after.get(endpoint, 0)

    # ---- what the policies see ----
    def load(self, endpoint: str, now: float) -> float:
        own = self._counts.get(endpoint, 0)
        stats = self._stats.get(endpoint)
        if stats is None or now - stats.at > self.stale_s:
            return float(own)
        scraped = stats.running + stats.waiting + self.snapshot_correction(endpoint)
        return float(own) if own > scraped else scraped

    def loads(self, endpoints: tuple[str, ...]) -> list[float]:
        now = self.clock()
        return [self.load(ep, now) for ep in endpoints]

    # ---- the fleet ----
    def kv_capacity_tokens(self) -> float:
        """The fleet's GPU KV capacity in tokens: the last capacity each present endpoint's page stated (a
        configuration, so it does not go stale with the scrape); 0 when none stated one."""
        return self._fleet_capacity if self._capacity else 0.0

    def drop(self, endpoint: str) -> None:
        """An endpoint left the fleet: forget its counts and stats; outstanding leases become no-ops."""
        self._fleet_capacity -= self._capacity.pop(endpoint, 0.0)
        self._counts.pop(endpoint, None)
        self._started_after.pop(endpoint, None)
        self._ended_after.pop(endpoint, None)
        self._stats.pop(endpoint, None)
        self.queueing.discard(endpoint)
        self._snapshot_epoch.pop(endpoint, None)
        self._generation.pop(endpoint, None)  # outstanding leases carry a number it will never have again
        self._order.discard(endpoint)

    def clear(self) -> None:
        for endpoint in list(self._counts):
            self.drop(endpoint)

    def _generation_of(self, endpoint: str) -> int:
        generation = self._generation.get(endpoint)
        if generation is None:
            self._generations += 1
            generation = self._generation[endpoint] = self._generations
        return generation

    # ---- the load order (fleet members) ----
    def join(self, endpoint: str) -> None:
        """Discovery added `endpoint`: it enters the order at its load (0 unless counts arrived first)."""
        self._order.set(endpoint, self.load(endpoint, self.clock()))

    def ordered(self, now: float | None = None) -> LoadOrder:
        """The fleet's loads in order, as of `now` (scrapes that went stale since are reordered first)."""
        self._expire(self.clock() if now is None else now)
        return self._order

    def _reorder(self, endpoint: str) -> None:
        if endpoint in self._order:
            self._order.set(endpoint, self.load(endpoint, self.clock()))

    def _expire(self, now: float) -> None:
        heap = self._scraped_at
        while heap and now - heap[0][0] > self.stale_s:
            at, endpoint = heapq.heappop(heap)
            stats = self._stats.get(endpoint)
            if stats is not None and stats.at == at:  # not refreshed since: its load is its own count now
                self.queueing.discard(endpoint)
                self._reorder(endpoint)
