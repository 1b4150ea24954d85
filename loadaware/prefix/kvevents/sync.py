"""Sequence bookkeeping for one engine's KV-event feed. Pure: says what to do, the I/O layer does it.

Why each rule keeps the index a subset of what the engine really holds (never phantom credit):
- Applying any suffix of an engine's event history to an EMPTY index yields only blocks that are really
  there (a block we index was stored after the suffix began and not removed since). So a feed we join late
  starts empty and asks the replay socket for everything it still buffers (from sequence 0).
- A gap mid-stream may hide removals: ask for a replay from the first missing number. If the replay no longer
  has it, the index is cleared and rebuilt from what the replay does have (the rule above).
- A sequence number that goes backwards means a new publisher (an engine restart): clear, start over.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from loadaware.prefix.blocks import BlockIndex
from loadaware.prefix.kvevents.codec import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from loadaware.prefix.kvevents.groups import GroupRouter


class Verdict(Enum):
    APPLY = "apply"  # the next expected batch
    STALE = "stale"  # already applied (a replay overlapped the live stream): skip
    GAP = "gap"  # batches are missing: replay from `replay_from`, then apply this one
    JOIN = "join"  # first batch seen on this connection: replay the buffered history, then apply
    RESTART = "restart"  # the numbering went backwards: clear the engine's index, then treat as JOIN


@dataclass(slots=True)
class FeedSync:
    last: int | None = None  # highest sequence applied on this feed; None = nothing applied yet
    # Live numbers in (floor, last] are duplicates of batches a replay already applied (they queued in the
    # socket meanwhile); a live number at or below `floor` can only come from a new, restarted publisher.
    floor: int = -1

    def classify(self, seq: int) -> Verdict:
        if self.last is None:
            return Verdict.APPLY if seq == 0 else Verdict.JOIN
        if seq == self.last + 1:
            return Verdict.APPLY
        if seq > self.last + 1:
            return Verdict.GAP
        return Verdict.STALE if seq > self.floor else Verdict.RESTART

    @property
    def replay_from(self) -> int:
        return 0 if self.last is None else self.last + 1

    def accept_replayed(self, seq: int) -> Verdict:
        """A batch from the replay socket: APPLY it, skip it (STALE), or GAP = the replay no longer holds
        the numbers we need (clear the index, then APPLY from here)."""
        if self.last is not None and seq <= self.last:
            return Verdict.STALE
        if self.last is None or seq == self.last + 1:
            # Joining: whatever the buffer starts at is a suffix of the history: safe on an empty index.
            return Verdict.APPLY
        return Verdict.GAP

    def applied(self, seq: int, live: bool) -> None:
        if live:
            self.floor = seq  # the live stream is monotonic: nothing at or below this comes again
        self.last = seq

    def reset(self) -> None:
        self.last = None
        self.floor = -1


@dataclass(slots=True)
class ApplyCounts:
    stored: int = 0  # blocks newly indexed
    removed: int = 0  # blocks that left the engine's index
    cleared: int = 0  # blocks dropped by AllBlocksCleared
    orphans: int = 0  # stored blocks whose parent we never saw (not indexed)
    evicted: int = 0  # entries dropped by the memory bound
    events: int = 0
    block_events: int = 0  # block hashes carried by stored / removed events (the ingest-rate unit)
    uncredited: int = 0  # block hashes of groups that are not prefix credit (sliding window, mamba...)


def apply_batch(index: BlockIndex, engine: str | GroupRouter, events: Iterable[KVEvent],
                counts: ApplyCounts | None = None) -> ApplyCounts:
    """What one decoded batch does to one engine's parts of the index, in order. `engine` is the feed's
    GroupRouter (a bare name: a fresh router, enough for a model without groups); each credited group's
    blocks go to their own part, other groups' blocks are counted and dropped (groups.py)."""
    router = GroupRouter(engine) if isinstance(engine, str) else engine
    c = counts if counts is not None else ApplyCounts()
    for event in events:
        c.events += 1
        if isinstance(event, BlockStored):
            c.block_events += len(event.block_hashes)
            part = router.stored(index, event.group_idx, event.kind)
            if part is None:
                c.uncredited += len(event.block_hashes)
                continue
            r = index.store(part, event.block_hashes, event.parent_block_hash, event.token_ids,
                            event.block_size, event.medium, event.extra())
            c.stored += r.stored
            c.orphans += r.orphans
            c.evicted += r.evicted
        elif isinstance(event, BlockRemoved):
            c.block_events += len(event.block_hashes)
            part = router.removed(event.group_idx)
            if part is None:
                c.uncredited += len(event.block_hashes)
                continue
            c.removed += index.remove(part, event.block_hashes, event.medium)
        elif isinstance(event, AllBlocksCleared):
            c.cleared += router.clear(index)
    return c
