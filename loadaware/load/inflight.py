"""The sidecar's own count of requests in flight per endpoint.

A request is counted the moment it is decided (before any later await) and released exactly once when
its ext_proc stream ends, whatever ended it (DESIGN.md §8 rule 3). Leases make the release idempotent
and survive an endpoint vanishing in between.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Lease:
    endpoint: str
    generation: int  # the endpoint's generation when acquired: a removed-then-re-added endpoint starts fresh
    snapshot: int  # the endpoint's scrape epoch when acquired: was this request in the last scrape?
    released: bool = False


class InflightTracker:
    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._generation: dict[str, int] = {}
        # Corrections to the last scraped snapshot, per endpoint: requests decided since it that are still
        # open (the scrape cannot see them yet: without this a burst herds onto one engine), minus requests
        # the scrape saw that have ended since (without this a finished request weighs until the next scrape).
        self._snapshot_epoch: dict[str, int] = {}
        self._started_after: dict[str, int] = {}
        self._ended_after: dict[str, int] = {}

    def acquire(self, endpoint: str) -> Lease:
        self._counts[endpoint] = self._counts.get(endpoint, 0) + 1
        self._started_after[endpoint] = self._started_after.get(endpoint, 0) + 1
        return Lease(endpoint, self._generation.get(endpoint, 0), self._snapshot_epoch.get(endpoint, 0))

    def release(self, lease: Lease | None) -> None:
        if lease is None or lease.released:
            return
        lease.released = True
        if self._generation.get(lease.endpoint, 0) != lease.generation:
            return  # the endpoint was dropped (and maybe re-added) since: its counts were already reset
        ep = lease.endpoint
        count = self._counts.get(ep, 0)
        if count > 0:
            self._counts[ep] = count - 1
        if lease.snapshot == self._snapshot_epoch.get(ep, 0):
            self._started_after[ep] = max(0, self._started_after.get(ep, 0) - 1)
        else:
            self._ended_after[ep] = self._ended_after.get(ep, 0) + 1

    def count(self, endpoint: str) -> int:
        return self._counts.get(endpoint, 0)

    def snapshot_correction(self, endpoint: str) -> int:
        """Own requests to add to the last scraped load: started since it and open, minus ended since it."""
        return self._started_after.get(endpoint, 0) - self._ended_after.get(endpoint, 0)

    def mark_snapshot(self, endpoint: str) -> None:
        self._snapshot_epoch[endpoint] = self._snapshot_epoch.get(endpoint, 0) + 1
        self._started_after[endpoint] = 0
        self._ended_after[endpoint] = 0

    def drop(self, endpoint: str) -> None:
        """An endpoint left the fleet: forget its counts; outstanding leases become no-ops."""
        self._counts.pop(endpoint, None)
        self._started_after.pop(endpoint, None)
        self._ended_after.pop(endpoint, None)
        self._generation[endpoint] = self._generation.get(endpoint, 0) + 1

    def clear(self) -> None:
        for endpoint in list(self._counts):
            self.drop(endpoint)

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)

    def total(self) -> int:
        return sum(self._counts.values())
