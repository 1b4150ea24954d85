"""`lmcache`: prefix matches from the LMCache controller (prefix/lmcache/), credited through the instance bridge.

Exact but incomplete: it credits each 256-token chunk to the first registered engine that holds it, so `auto`
puts the sidecar's record beside it. It is built whenever --lmcache-url is set, selected or not, so the instance
map that Explain, ListEndpoints and /debug/state show stays fresh (and readiness waits for its first attempt).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from loadaware.prefix.lmcache.client import LMCacheClient
from loadaware.prefix.lmcache.resolver import InstanceResolver
from loadaware.prefix.lmcache.source import LMCachePrefixSource
from loadaware.prefix.spec import BuildContext, Built, SourceSpec, Task


@dataclass(frozen=True)
class LMCacheOptions:
    lmcache_url: str = ""
    lmcache_timeout_ms: float = 100.0
    instance_refresh_s: float = 30.0


class LMCacheParts(Built):
    def __init__(self, options: LMCacheOptions, context: BuildContext) -> None:
        self.client = LMCacheClient(options.lmcache_url, options.lmcache_timeout_ms / 1e3)
        self.resolver = InstanceResolver(self.client, context.bridge, options.instance_refresh_s)
        bridge = context.bridge
        super().__init__(LMCachePrefixSource(self.client, bridge, self.resolver, context.metrics),
                         lambda eps: {ep for ep in eps if bridge.instance_for(ep)})

    def tasks(self) -> list[tuple[str, Task]]:
        return [("lmcache-instances", self.resolver.run)]

    def endpoints_changed(self, endpoints: tuple[str, ...]) -> None:
        self.resolver.request_full()

    def ready(self) -> bool:
        return self.resolver.attempts > 0  # tried once, successful or not (fail open)

    async def close(self) -> None:
        await self.client.close()


def _check(options: LMCacheOptions, selected: bool) -> str | None:
    return "--prefix-source: lmcache needs --lmcache-url" if selected and not options.lmcache_url else None


LMCACHE = SourceSpec(
    "lmcache", LMCacheParts, LMCacheOptions, exact=True, complete=False, needs_tokenizer=True,
    default=lambda o: bool(o.lmcache_url), auto_help="lmcache with --lmcache-url and --tokenizer",
    configured=lambda o: bool(o.lmcache_url), check=_check, title="LMCache",
    why_default="LMCache credits one holder per chunk, so the sidecar's record of where it sent each prefix adds "
                "the other holders")


def instance_resolver(parts: Mapping[str, Built]) -> InstanceResolver | None:
    """LMCache's instance-map resolver among the built sources (None without --lmcache-url): readiness waits for
    its first attempt (runtime/readiness.py)."""
    built = parts.get(LMCACHE.name)
    return built.resolver if isinstance(built, LMCacheParts) else None
