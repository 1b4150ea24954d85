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
    released: bool = False


class InflightTracker:
    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._generation: dict[str, int] = {}
        # decisions per endpoint since its last scraped snapshot: closes the scrape-lag herding window
        self._since_snapshot: dict[str, int] = {}

    def acquire(self, endpoint: str) -> Lease:
        self._counts[endpoint] = self._counts.get(endpoint, 0) + 1
        self._since_snapshot[endpoint] = self._since_snapshot.get(endpoint, 0) + 1
        return Lease(endpoint, self._generation.get(endpoint, 0))

    def release(self, lease: Lease | None) -> None:
        if lease is None or lease.released:
            return
        lease.released = True
        if self._generation.get(lease.endpoint, 0) != lease.generation:
            return  # the endpoint was dropped (and maybe re-added) since: its counts were already reset
        count = self._counts.get(lease.endpoint, 0)
        if count > 0:
            self._counts[lease.endpoint] = count - 1

    def count(self, endpoint: str) -> int:
        return self._counts.get(endpoint, 0)

    def since_snapshot(self, endpoint: str) -> int:
        return self._since_snapshot.get(endpoint, 0)

    def mark_snapshot(self, endpoint: str) -> None:
        self._since_snapshot[endpoint] = 0

    def drop(self, endpoint: str) -> None:
        """An endpoint left the fleet: forget its counts; outstanding leases become no-ops."""
        self._counts.pop(endpoint, None)
        self._since_snapshot.pop(endpoint, None)
        self._generation[endpoint] = self._generation.get(endpoint, 0) + 1

    def clear(self) -> None:
        for endpoint in list(self._counts):
            self.drop(endpoint)

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)

    def total(self) -> int:
        return sum(self._counts.values())
