"""Prefix matches from the LMCache controller, as the decision pipeline asks for them."""

from __future__ import annotations

from collections.abc import Sequence

from loadaware.prefix.lmcache.bridge import InstanceBridge
from loadaware.prefix.lmcache.client import LMCacheClient
from loadaware.prefix.lmcache.resolver import InstanceResolver
from loadaware.prefix.source import PrefixUnavailable
from loadaware.telemetry.metrics import Metrics


class LMCachePrefixSource:
    """Prefix matches from the LMCache controller, credited to live endpoints through the instance bridge."""

    name = "lmcache"

    def __init__(self, client: LMCacheClient, bridge: InstanceBridge, resolver: InstanceResolver | None,
                 metrics: Metrics) -> None:
        self.client = client
        self.bridge = bridge
        self.resolver = resolver
        self.metrics = metrics

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...]) -> dict[str, int]:
        try:
            layout = await self.client.lookup(tokens)
        except PrefixUnavailable:
            self.metrics.lookup_result("failed")
            raise
        credit = self.bridge.credit(layout, endpoints)
        if credit.unknown_ids:
            self.metrics.unmapped_holders.labels("unknown").inc(len(credit.unknown_ids))
            if self.resolver is not None:
                self.resolver.report_unknown(credit.unknown_ids)
        if credit.ignored_ids:
            self.metrics.unmapped_holders.labels("dead_or_outside").inc(len(credit.ignored_ids))
        self.metrics.lookup_result("match" if credit.matches else "empty")
        return credit.matches
