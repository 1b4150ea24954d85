"""`kv-events`: an exact multi-holder index fed by every engine's vLLM KV events (prefix/kvevents/).

Feeds are dialled at each endpoint's host (or the explicit map); with --kv-events-bind the engines connect to
the sidecar instead and only explicitly mapped engines are dialled. Never selected by `auto`: the engines must
be started with KV events on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from loadaware.fleet.addresses import FeedAddress
from loadaware.prefix.blocks import DEFAULT_MAX_BLOCKS, BlockIndex
from loadaware.prefix.kvevents.feeds import FeedOptions, KvEventsFeeds
from loadaware.prefix.kvevents.inbound import InboundKvEvents
from loadaware.prefix.kvevents.query import KvEventsPrefixSource
from loadaware.prefix.spec import BuildContext, Built, SourceSpec, Task


@dataclass(frozen=True)
class KvEventsOptions:
    kv_events_max_blocks: int = DEFAULT_MAX_BLOCKS
    kv_events_endpoints: Mapping[str, FeedAddress] = field(default_factory=dict)
    kv_events_port: int = 5557
    kv_events_replay_port: int = 5558
    kv_events_topic: str = ""
    kv_events_replay_timeout_ms: float = 2000.0
    kv_events_dp_ranks: int = 1
    kv_events_bind: str = ""  # HOST:PORT the engines connect to ("" = engines bind, the sidecar connects)
    kv_events_topic_map: Mapping[str, str] = field(default_factory=dict)


class KvEventsParts(Built):
    def __init__(self, o: KvEventsOptions, context: BuildContext) -> None:
        index = BlockIndex(o.kv_events_max_blocks)
        # With a bind address the engines connect to us: only explicitly mapped engines are dialled.
        pub_port = 0 if o.kv_events_bind else o.kv_events_port
        self.feeds = KvEventsFeeds(index, context.metrics, context.endpoints, FeedOptions(
            dict(o.kv_events_endpoints), pub_port, o.kv_events_replay_port, o.kv_events_topic,
            o.kv_events_replay_timeout_ms / 1e3, o.kv_events_dp_ranks), spawn=context.spawn)
        self.inbound = InboundKvEvents(self.feeds, o.kv_events_bind, o.kv_events_topic_map,
                                       o.kv_events_replay_port, context.endpoints) if o.kv_events_bind else None
        source = KvEventsPrefixSource(index, self.feeds)
        super().__init__(source, source.covered)
        self.fleet_listener = self.feeds

    def tasks(self) -> list[tuple[str, Task]]:
        out: list[tuple[str, Task]] = [("kv-events", self.feeds.run)]
        if self.inbound is not None:
            out.append(("kv-events-inbound", self.inbound.run))
        return out

    def state(self) -> dict[str, object]:
        kv_events = self.feeds.state()
        if self.inbound is not None:
            kv_events["inbound"] = self.inbound.state()
        return kv_events

    def refresh_gauges(self) -> None:
        self.feeds.refresh_gauges()

    def endpoint_removed(self, endpoint: str) -> None:
        self.feeds.remove(endpoint)

    async def close(self) -> None:
        await self.feeds.close()


def _check(options: KvEventsOptions, selected: bool) -> str | None:
    if options.kv_events_bind and not selected:
        return "--kv-events-bind: the engines' KV events feed --prefix-source kv-events; add it"
    return None


KV_EVENTS = SourceSpec("kv-events", KvEventsParts, KvEventsOptions, exact=True, complete=True,
                       needs_tokenizer=True, check=_check, title="KV events")
