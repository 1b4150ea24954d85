"""Builds the prefix sources `--prefix-source` asks for and owns their background work, so the app only
starts, shows and stops them. It takes plain options, never the configuration object: the app translates."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from loadaware.fleet.addresses import FeedAddress
from loadaware.prefix.approx import ApproxIndex, ApproxPrefixSource
from loadaware.prefix.blocks import BlockIndex
from loadaware.prefix.combined import CombinedPrefixSource, Covered, Member
from loadaware.prefix.counted import SourceLookups
from loadaware.prefix.kvevents.feeds import KvEventsFeeds, Spawn
from loadaware.prefix.kvevents.inbound import InboundKvEvents
from loadaware.prefix.kvevents.query import KvEventsPrefixSource
from loadaware.prefix.source import PrefixSource
from loadaware.telemetry.metrics import Metrics

SOURCE_NAMES = ("lmcache", "kv-events", "approx")
# The approximate index counts blocks of 16 tokens (vLLM's default block), or of 16 text units without a tokenizer.
APPROX_TOKEN_BLOCK = 16


@dataclass(frozen=True)
class PrefixOptions:
    names: tuple[str, ...]  # among SOURCE_NAMES
    have_tokenizer: bool
    kv_events_max_blocks: int = 1_500_000
    kv_events_endpoints: Mapping[str, FeedAddress] = field(default_factory=dict)
    kv_events_port: int = 5557
    kv_events_replay_port: int = 5558
    kv_events_topic: str = ""
    kv_events_replay_timeout_s: float = 2.0
    kv_events_dp_ranks: int = 1
    kv_events_bind: str = ""  # HOST:PORT the engines connect to ("" = engines bind, the sidecar connects)
    kv_events_topic_map: Mapping[str, str] = field(default_factory=dict)
    approx_capacity_tokens: int = 100_000
    approx_ttl_s: float = 300.0
    approx_max_blocks: int = 500_000


class PrefixWiring:
    def __init__(self, options: PrefixOptions, metrics: Metrics, endpoints: Callable[[], tuple[str, ...]],
                 lmcache: PrefixSource | None, lmcache_covered: Covered | None, spawn: Spawn | None = None) -> None:
        o = options
        self.names = o.names
        self.kv_feeds: KvEventsFeeds | None = None
        self.kv_inbound: InboundKvEvents | None = None
        self.approx: ApproxPrefixSource | None = None
        exact: list[Member] = []
        lookups = SourceLookups(metrics.registry)  # each source's answers counted apart (its match fraction)
        if "lmcache" in self.names and lmcache is not None:
            exact.append(Member(lookups.wrap(lmcache), lmcache_covered or (lambda eps: set(eps)), complete=False))
        if "kv-events" in self.names:
            index = BlockIndex(o.kv_events_max_blocks)
            # With a bind address the engines connect to us: only explicitly mapped engines are dialled.
            pub_port = 0 if o.kv_events_bind else o.kv_events_port
            self.kv_feeds = KvEventsFeeds(index, metrics, endpoints, dict(o.kv_events_endpoints), pub_port,
                                          o.kv_events_replay_port, o.kv_events_topic, o.kv_events_replay_timeout_s,
                                          dp_ranks=o.kv_events_dp_ranks, spawn=spawn)
            if o.kv_events_bind:
                self.kv_inbound = InboundKvEvents(self.kv_feeds, o.kv_events_bind, o.kv_events_topic_map,
                                                  o.kv_events_replay_port, endpoints)
            kv = KvEventsPrefixSource(index, self.kv_feeds)
            exact.append(Member(lookups.wrap(kv), kv.covered))
        if "approx" in self.names:
            # Tokens, or without a tokenizer text units of ~a token each (tokenize/text_units.py): one block size.
            self.approx = ApproxPrefixSource(
                ApproxIndex(max(1, o.approx_capacity_tokens // APPROX_TOKEN_BLOCK), APPROX_TOKEN_BLOCK, o.approx_ttl_s,
                            o.approx_max_blocks), metrics)
        for name in SOURCE_NAMES:
            metrics.prefix_source_info.labels(name, "false" if name == "approx" else "true").set(
                1 if name in self.names else 0)
        self.source: PrefixSource | None
        if len(exact) == 1 and self.approx is None:
            self.source = exact[0].source
        elif not exact and self.approx is not None:
            self.source = lookups.wrap(self.approx)
        elif exact or self.approx is not None:
            self.source = CombinedPrefixSource(exact, lookups.wrap(self.approx) if self.approx else None)
        else:
            self.source = None

    def tasks(self) -> list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]]:
        out: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = []
        if self.kv_feeds is not None:
            out.append(("kv-events", self.kv_feeds.run))
        if self.kv_inbound is not None:
            out.append(("kv-events-inbound", self.kv_inbound.run))
        if self.approx is not None:
            out.append(("approx-decay", self.approx.run))
        return out

    def endpoint_removed(self, endpoint: str) -> None:
        if self.kv_feeds is not None:
            self.kv_feeds.remove(endpoint)
        if self.approx is not None:
            self.approx.drop(endpoint)

    def refresh_gauges(self) -> None:
        if self.kv_feeds is not None:
            self.kv_feeds.refresh_gauges()
        if self.approx is not None:
            self.approx.refresh_gauges()

    def state(self) -> dict[str, object]:
        out: dict[str, object] = {"sources": list(self.names)}
        if self.kv_feeds is not None:
            kv_events = self.kv_feeds.state()
            if self.kv_inbound is not None:
                kv_events["inbound"] = self.kv_inbound.state()
            out["kv_events"] = kv_events
        if self.approx is not None:
            out["approx"] = self.approx.state()
        return out

    async def close(self) -> None:
        if self.kv_feeds is not None:
            await self.kv_feeds.close()
