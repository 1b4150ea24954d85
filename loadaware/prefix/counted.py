"""Lookups counted per prefix source, so each source's match fraction can be told apart from the others'.

The counter is declared beside the sources it counts (like the discovery metrics), on the sidecar's one
registry; every source's children are created at zero when it is wrapped, so a source that never matched
still has series (a dashboard or an alert sees 0, not "no data").
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter

from loadaware.prefix.source import PrefixSource, PrefixUnavailable

RESULTS = ("match", "empty", "failed")


class SourceLookups:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.lookups = Counter("loadaware_prefix_source_lookups", "Prefix lookups per source (lmcache, kv-events, "
                               "approx) by result: match (some endpoint credited), empty, failed",
                               ["source", "result"], registry=registry)

    def wrap(self, source: PrefixSource) -> CountedSource:
        return CountedSource(source, *(self.lookups.labels(source.name, r) for r in RESULTS))


class CountedSource:
    """A prefix source whose every answer is counted; the answer itself passes through untouched."""

    def __init__(self, source: PrefixSource, match: Counter, empty: Counter, failed: Counter) -> None:
        self.source = source
        self.name = source.name
        self._match, self._empty, self._failed = match, empty, failed

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        try:
            found = await self.source.matches(tokens, endpoints, salt)
        except PrefixUnavailable:
            self._failed.inc()
            raise
        (self._match if any(found.values()) else self._empty).inc()
        return found
