"""The KV-events prefix source's query: matched tokens for every engine that holds the prompt's prefix, read
from the index the feeds (kvevents/feeds.py) keep. Only in-memory reads: no I/O, no awaits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from loadaware.prefix.blocks import BlockIndex, block_keys, chain_keys
from loadaware.prefix.source import salt_of


class FeedParts(Protocol):
    """What the query needs of the feeds: which endpoints are split into parts, and which are covered."""

    @property
    def split(self) -> Mapping[str, tuple[str, ...]]: ...

    def covered(self, endpoints: Sequence[str]) -> set[str]: ...


class KvEventsPrefixSource:
    """Matched tokens for every engine holding the prompt's prefix, from the KV-events index."""

    name = "kv-events"
    exact = True

    def __init__(self, index: BlockIndex, feeds: FeedParts | None = None) -> None:
        self.index = index
        self.feeds = feeds

    def lookup(self, tokens: Sequence[int], endpoints: Sequence[str], salt: str | None = None) -> dict[str, int]:
        """Synchronous core (the discrete-event experiment and the benchmark call it directly). A salted
        request walks the chain its salt starts (blocks.block_keys): only blocks stored under that salt
        credit it, and salted blocks never credit an unsalted request. An endpoint made of several parts
        (credited KV-cache groups, data-parallel ranks) is credited with the minimum over them: a part
        that holds nothing leaves the endpoint out."""
        salt = salt_of(tokens, salt)
        split = self.feeds.split if self.feeds is not None else None
        index = self.index
        sizes: dict[int, list[str]] = {}
        owner: dict[str, str] = {}  # part -> endpoint, for endpoints indexed under other names than their own
        need: dict[str, int] = {}
        for ep in endpoints:
            if split and (parts := split.get(ep)) is not None:
                need[ep] = len(parts)
                for part in parts:
                    owner[part] = ep
                    size = index.block_size(part)
                    if size is not None:
                        sizes.setdefault(size, []).append(part)
                continue
            size = index.block_size(ep)
            if size is not None:
                sizes.setdefault(size, []).append(ep)
        out: dict[str, int] = {}
        if not owner:  # the common case: every endpoint is one part under its own name
            for size, names in sizes.items():
                out.update(index.match(chain_keys(tokens, size, salt), size, names))
            return out
        got: dict[str, int] = {}
        for size, names in sizes.items():
            for part, n in index.match(block_keys(tokens, size, salt=salt), size, names).items():
                ep = owner.get(part, part)
                out[ep] = min(out.get(ep, n), n)
                got[ep] = got.get(ep, 0) + 1
        return {ep: n for ep, n in out.items() if got[ep] == need.get(ep, 1)}

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        return self.lookup(tokens, endpoints, salt)

    def covered(self, endpoints: Sequence[str]) -> set[str]:
        return set() if self.feeds is None else self.feeds.covered(endpoints)
