"""Several prefix sources at once (`--prefix-source lmcache,kv-events,approx`).

Exact sources (LMCache, KV events) are asked together and each endpoint gets the best of their answers:
LMCache may know chunks offloaded where KV events are not published, KV events know every holder where
LMCache credits one. The approximate source only speaks for endpoints that no exact source covers (an
engine with neither LMCache nor a KV-event feed): a guess never overrides a fact. One source failing
leaves the others' answers; only when every source fails does the decision fall back to load alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loadaware.prefix.source import PrefixSource, PrefixUnavailable

if TYPE_CHECKING:
    from loadaware.config import Settings
    from loadaware.telemetry.metrics import Metrics

Covered = Callable[[Sequence[str]], set[str]]


@dataclass
class Member:
    source: PrefixSource
    covered: Covered  # endpoints this source speaks for


class CombinedPrefixSource:
    def __init__(self, exact: Sequence[Member], approx: PrefixSource | None = None) -> None:
        if not exact and approx is None:
            raise ValueError("no prefix source to combine")
        self.exact = list(exact)
        self.approx = approx
        self.name = ",".join([m.source.name for m in self.exact] + ([approx.name] if approx else []))

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...]) -> dict[str, int]:
        answers = await asyncio.gather(*(m.source.matches(tokens, endpoints) for m in self.exact),
                                       return_exceptions=True)
        merged: dict[str, int] = {}
        failure: BaseException | None = None
        covered: set[str] = set()
        for member, answer in zip(self.exact, answers):
            if isinstance(answer, BaseException):
                if not isinstance(answer, PrefixUnavailable):
                    raise answer
                failure = failure or answer
                continue
            covered |= member.covered(endpoints)
            for endpoint, matched in answer.items():
                if matched > merged.get(endpoint, 0):
                    merged[endpoint] = matched
        all_failed = failure is not None and all(isinstance(a, BaseException) for a in answers)
        if self.approx is not None:
            # With every exact source down, the guess speaks for every endpoint: better than nothing.
            rest = tuple(ep for ep in endpoints if ep not in covered)
            if rest:
                for endpoint, matched in (await self.approx.matches(tokens, rest)).items():
                    merged[endpoint] = max(matched, merged.get(endpoint, 0))
        elif all_failed:
            assert failure is not None
            raise failure
        return merged

    def routed(self, tokens: Sequence[int], endpoint: str) -> None:
        observe = getattr(self.approx, "routed", None)
        if observe is not None:
            observe(tokens, endpoint)


class PrefixWiring:
    """Builds the prefix sources `--prefix-source` asks for and owns their background work, so the app only
    starts, shows and stops them."""

    def __init__(self, settings: "Settings", metrics: "Metrics", endpoints: Callable[[], tuple[str, ...]],
                 lmcache: PrefixSource | None, lmcache_covered: Covered | None) -> None:
        from loadaware.prefix.approx import ApproxIndex, ApproxPrefixSource
        from loadaware.prefix.blocks import BlockIndex
        from loadaware.prefix.kvevents.feeds import KvEventsFeeds, KvEventsPrefixSource, parse_feed_map

        s = settings
        self.names = s.prefix_sources
        self.kv_feeds: KvEventsFeeds | None = None
        self.approx: ApproxPrefixSource | None = None
        exact: list[Member] = []
        if "lmcache" in self.names and lmcache is not None:
            exact.append(Member(lmcache, lmcache_covered or (lambda eps: set(eps))))
        if "kv-events" in self.names:
            index = BlockIndex(s.kv_events_max_blocks)
            explicit = parse_feed_map(",".join(f"{ep}={target}" for ep, target in s.kv_events_endpoints.items()))
            self.kv_feeds = KvEventsFeeds(index, metrics, endpoints, explicit, s.kv_events_port,
                                          s.kv_events_replay_port, s.kv_events_topic,
                                          s.kv_events_replay_timeout_ms / 1e3)
            kv = KvEventsPrefixSource(index, self.kv_feeds)
            exact.append(Member(kv, kv.covered))
        if "approx" in self.names:
            # Without a tokenizer the units are text bytes (TextUnits), in 64-byte blocks.
            block = 16 if s.tokenizer else 64
            self.approx = ApproxPrefixSource(
                ApproxIndex(max(1, s.approx_capacity_tokens // 16), block, s.approx_ttl_s), metrics)
        for name in ("lmcache", "kv-events", "approx"):
            metrics.prefix_source_info.labels(name, "false" if name == "approx" else "true").set(
                1 if name in self.names else 0)
        self.source: PrefixSource | None
        if len(exact) == 1 and self.approx is None:
            self.source = exact[0].source
        elif not exact and self.approx is not None:
            self.source = self.approx
        elif exact or self.approx is not None:
            self.source = CombinedPrefixSource(exact, self.approx)
        else:
            self.source = None

    @property
    def on_routed(self) -> Callable[[Sequence[int], str], None] | None:
        return None if self.approx is None else self.approx.routed

    def text_units_tokenizer(self, have_tokenizer: bool) -> object | None:
        """Only the approximate source, alone, may route on text bytes when no tokenizer is configured."""
        if have_tokenizer or self.names != ("approx",):
            return None
        from loadaware.prefix.approx import TextUnits

        return TextUnits()

    def tasks(self) -> list[tuple[str, Callable[[], object]]]:
        out: list[tuple[str, Callable[[], object]]] = []
        if self.kv_feeds is not None:
            out.append(("kv-events", self.kv_feeds.run))
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
            out["kv_events"] = self.kv_feeds.state()
        if self.approx is not None:
            out["approx"] = self.approx.state()
        return out

    async def close(self) -> None:
        if self.kv_feeds is not None:
            await self.kv_feeds.close()
