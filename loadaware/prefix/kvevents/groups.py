"""Hybrid models and data-parallel engines: which KV-event blocks earn prefix credit, and under which name.

What vLLM publishes (`vllm/distributed/kv_events.py`): `BlockStored` carries `group_idx` (the KV-cache
group) and the group's `kv_cache_spec_kind`, a plain string (the value of `KVCacheSpecKind` in
`vllm/v1/kv_cache_interface.py`: "full_attention", "mla_attention", "sink_full_attention",
"sliding_window", "sliding_window_mla", "chunked_local_attention", "mamba", "encoder_only_attention",
"cross_attention", "unknown"), plus `kv_cache_spec_sliding_window`; `BlockRemoved` carries only `group_idx`
("Remove events only need group_idx+hash": consumers learn each group's kind from its stores). The same
block hash appears once per group that cached it, so a removal in one group says nothing about another.

How vLLM decides a hit for a hybrid model (`HybridKVCacheCoordinator.find_longest_cache_hit` in
`vllm/v1/core/kv_cache_coordinator.py`): groups of one spec are looked up together (a block counts only if
every group of the spec holds it); full-attention specs go first and give the longest contiguous prefix;
each other spec (sliding window: the window's blocks ending at the candidate length; mamba: the state at
that length) may only shorten the candidate, until a fixed point. The final hit is never longer than any
full-attention group's own prefix.

What the sidecar credits, then:
- a group is prefix credit when its kind is a full-attention kind ("full_attention", "mla_attention",
  "sink_full_attention": the FullAttentionSpec family), or when the event names no kind (vLLM without
  groups: everything is full attention). Sliding-window, chunked-local, mamba, encoder/cross and unknown
  groups are never credited: their blocks are not indexed, and their removals touch nothing;
- each credited group is indexed on its own (a part); an engine's credit is the MINIMUM over its credited
  groups. For a hybrid model it is therefore the full-attention prefix: an upper bound of vLLM's hit,
  which the sliding-window or mamba groups may shorten (the sidecar does not model their windows/states);
- a model with no full-attention group at all (pure sliding window, pure mamba) earns no credit.

Data parallelism: each DP rank runs its own publisher, on the configured ports plus its rank (vLLM's
`ZmqEventPublisher.offset_endpoint_port`, both PUB and replay), with its own sequence numbering, and stamps
its batches with `data_parallel_rank`. One endpoint serving N ranks is N feeds (one per rank, each with
its own parts). vLLM's front end picks a rank by load, not by prefix (`DPLBAsyncMPClient.
get_core_engine_for_request` in `vllm/v1/engine/core_client.py`: the lowest `waiting * 4 + running`,
unless the request names its rank), so the endpoint is credited with the minimum over its ranks: only
what every rank holds is sure to hit. A batch stamped with another rank than its feed's is not applied.
"""

from __future__ import annotations

from collections.abc import Callable

from loadaware.prefix.blocks import BlockIndex

# KVCacheSpecKind values of the FullAttentionSpec family (MLAAttentionSpec and SinkFullAttentionSpec
# subclass FullAttentionSpec in vllm/v1/kv_cache_interface.py).
CREDITED_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})


def credited(kind: str | None) -> bool:
    """Whether blocks of a group of this kind make a prefix hit on their own (None: no kind sent)."""
    return kind is None or kind in CREDITED_KINDS


def rank_name(endpoint: str, rank: int) -> str:
    """The index name of one DP rank of an endpoint; rank 0 is the endpoint itself."""
    return endpoint if rank == 0 else f"{endpoint}#dp{rank}"


class GroupRouter:
    """One feed's (one engine, one DP rank) groups: learns each group's kind from its stores and names the
    index part its blocks go to. Group 0 (or no group) is the feed's own name; group g is `name#g<g>`."""

    __slots__ = ("kinds", "name", "on_change", "parts")

    def __init__(self, name: str, on_change: Callable[[], None] | None = None) -> None:
        self.name = name
        self.kinds: dict[int | None, str | None] = {}
        self.parts: dict[int | None, str] = {}  # credited groups seen -> index name
        self.on_change = on_change  # called when the credited parts change (the lookup caches them)

    def part_name(self, group: int | None) -> str:
        return self.name if group in (None, 0) else f"{self.name}#g{group}"

    def stored(self, index: BlockIndex, group: int | None, kind: str | None) -> str | None:
        """The part a store of `group` goes to, None when the group is not credited. A group whose kind
        changes to an uncredited one (a restarted engine with another model) loses its part."""
        if kind is None:
            kind = self.kinds.get(group)  # a store without a kind keeps what the group is known to be
        self.kinds[group] = kind
        if credited(kind):
            part = self.parts.get(group)
            if part is None:
                part = self.parts[group] = self.part_name(group)
                self._changed()
            return part
        old = self.parts.pop(group, None)
        if old is not None:
            index.clear(old)
            self._changed()
        return None

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def removed(self, group: int | None) -> str | None:
        """The part a removal of `group` applies to; None for an uncredited or never-stored group. Group 0
        (or none) always maps to the feed's own name: a removal can only under-credit."""
        part = self.parts.get(group)
        if part is None and group in (None, 0) and credited(self.kinds.get(group)):
            return self.name
        return part

    def credited_parts(self) -> tuple[str, ...]:
        """The names an engine's credit is the minimum over; its own name while it has stored nothing."""
        return tuple(dict.fromkeys(self.parts.values())) if self.parts else (self.name,)

    def clear(self, index: BlockIndex) -> int:
        """Drop every part's blocks (AllBlocksCleared); the groups and their kinds are kept."""
        return sum(index.clear(p) for p in set(self.parts.values()) | {self.name})

    def drop(self, index: BlockIndex) -> int:
        """A reset (restart, vanished, unrecoverable gap) or the engine left: drop every part and forget the
        groups, so a restarted engine with another group layout leaves no empty part behind (an empty part
        would deny the endpoint any credit)."""
        n = sum(index.drop(p) for p in set(self.parts.values()) | {self.name})
        self.parts.clear()
        self.kinds.clear()
        self._changed()
        return n

    def blocks(self, index: BlockIndex) -> int:
        return sum(index.blocks(p) for p in set(self.parts.values()) | {self.name})
