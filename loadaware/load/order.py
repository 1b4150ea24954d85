"""The fleet's endpoints ordered by load, with the running sum: the few least-loaded ones and the mean load
without visiting every endpoint (docs/architecture.md, "Fleet size").

Endpoints with the same load sit in one bucket, kept in lexical order, and the distinct loads in a sorted
list, so `least(k)` walks (load, endpoint) ascending, the order every policy breaks ties among endpoints
that hold nothing of the prompt. An update costs two binary searches and a list insertion (a memmove);
a query costs k steps plus the endpoints it is asked to skip. Pure: no clocks, no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

# The running sum is re-added from scratch this often, so float rounding cannot drift for ever.
RESUM_EVERY = 4096


class LoadOrder:
    def __init__(self) -> None:
        self._load: dict[str, float] = {}
        self._buckets: dict[float, list[str]] = {}  # load -> endpoints at it, lexically sorted
        self._values: list[float] = []  # the distinct loads, ascending
        self._total = 0.0
        self._updates = 0

    def __len__(self) -> int:
        return len(self._load)

    def __contains__(self, endpoint: object) -> bool:
        return endpoint in self._load

    @property
    def total(self) -> float:
        return self._total

    def mean(self) -> float:
        return self._total / len(self._load) if self._load else 0.0

    def load(self, endpoint: str) -> float | None:
        return self._load.get(endpoint)

    def set(self, endpoint: str, load: float) -> None:
        old = self._load.get(endpoint)
        if old == load:
            return
        if old is not None:
            self._unplace(endpoint, old)
            self._total -= old
        self._load[endpoint] = load
        bucket = self._buckets.get(load)
        if bucket is None:
            self._buckets[load] = [endpoint]
            bisect.insort(self._values, load)
        else:
            bisect.insort(bucket, endpoint)
        self._total += load
        self._counted()

    def discard(self, endpoint: str) -> None:
        old = self._load.pop(endpoint, None)
        if old is not None:
            self._unplace(endpoint, old)
            self._total -= old
            self._counted()

    def _unplace(self, endpoint: str, load: float) -> None:
        bucket = self._buckets[load]
        del bucket[bisect.bisect_left(bucket, endpoint)]
        if not bucket:
            del self._buckets[load]
            del self._values[bisect.bisect_left(self._values, load)]

    def _counted(self) -> None:
        self._updates += 1
        if self._updates >= RESUM_EVERY:
            self._updates = 0
            self._total = sum(self._load.values())

    def ascending(self) -> Iterator[tuple[float, str]]:
        """(load, endpoint), least loaded first, ties in lexical order. Do not change the order meanwhile."""
        for value in self._values:
            for endpoint in self._buckets[value]:
                yield value, endpoint

    def by_load(self) -> Iterator[tuple[float, list[str]]]:
        """(load, the endpoints at it in lexical order), least loaded first. Do not change the order meanwhile."""
        buckets = self._buckets
        for value in self._values:
            yield value, buckets[value]

    def least(self, k: int, skip: Callable[[str], bool] | None = None) -> list[str]:
        """The k least-loaded endpoints (ties: the lexically smaller first), leaving out those `skip` names."""
        out: list[str] = []
        if k <= 0:
            return out
        for _, endpoint in self.ascending():
            if skip is not None and skip(endpoint):
                continue
            out.append(endpoint)
            if len(out) >= k:
                break
        return out
