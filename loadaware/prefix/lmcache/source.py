"""Prefix matches from the LMCache controller, as the decision pipeline asks for them.

The controller cannot tell tenants apart: in lmcache 0.5.6 its `/lookup` takes token ids only and keys each
256-token chunk by the prefix hash of its tokens (`ChunkedTokenDatabase.process_tokens(tokens,
make_key=False)` in `KVController.lookup`), and the in-process vLLM connector that reports chunks to it never
reads vLLM's `cache_salt`. A salted request would be credited with chunks cached for any tenant, or for
none, while vLLM's own prefix cache would not serve it from another salt's blocks. So a salted request gets
no LMCache credit: the lookup is not sent, it counts as `loadaware_prefix_lookups_total{result="salted"}`,
and the decision says `lmcache_salted` (a fallback reason when no other source answers).
"""

from __future__ import annotations

from collections.abc import Sequence

from loadaware.lifecycle import previewing
from loadaware.prefix.lmcache.bridge import InstanceBridge
from loadaware.prefix.lmcache.client import LMCacheClient
from loadaware.prefix.lmcache.resolver import InstanceResolver
from loadaware.prefix.source import PrefixUnavailable, salt_of
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

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        quiet = previewing()  # Explain: count nothing, ask for no refresh
        if salt_of(tokens, salt) is not None:
            if not quiet:
                self.metrics.lookups.labels(result="salted").inc()
            raise PrefixUnavailable("lmcache_salted", "the LMCache controller cannot tell cache salts apart")
        try:
            layout = await self.client.lookup(tokens)
        except PrefixUnavailable:
            if not quiet:
                self.metrics.lookup_result("failed")
            raise
        credit = self.bridge.credit(layout, endpoints)
        if quiet:
            return credit.matches
        if credit.unknown_ids:
            self.metrics.unmapped_holders.labels("unknown").inc(len(credit.unknown_ids))
            if self.resolver is not None:
                self.resolver.report_unknown(credit.unknown_ids)
        if credit.ignored_ids:
            self.metrics.unmapped_holders.labels("dead_or_outside").inc(len(credit.ignored_ids))
        self.metrics.lookup_result("match" if credit.matches else "empty")
        return credit.matches
