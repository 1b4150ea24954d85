"""A vLLM-style GPU prefix cache: fixed-size token blocks, chained keys, LRU eviction.

Pure logic, no I/O and no clocks, so the engine, the unit tests and the discrete-event experiment share it.
A block's key is the builtin hash of (parent key, tuple of its token ids); tuple-of-int hashing does not
depend on PYTHONHASHSEED, so keys are stable across processes. Only full blocks are ever cached, as in vLLM.
Observers hear every stored / removed block (a later issue turns these into vLLM KV events, which need the
key, the parent key and the token ids of each stored block).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEFAULT_BLOCK_SIZE = 16  # vLLM's default block size


@dataclass(frozen=True, slots=True)
class Block:
    key: int
    parent: int | None  # None for the first block of a sequence (vLLM sends parent_block_hash=None)
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BlocksStored:
    blocks: tuple[Block, ...]


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    keys: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


CacheEvent = BlocksStored | BlocksRemoved | AllBlocksCleared
Observer = Callable[[CacheEvent], None]


def block_key(parent: int | None, tokens: tuple[int, ...]) -> int:
    # A root sentinel of 0 keeps the key an int-only tuple hash (deterministic across processes).
    return hash((0 if parent is None else parent, tokens))


def iter_blocks(tokens: Sequence[int], block_size: int) -> list[Block]:
    """Every full block of `tokens` with its chained key; a partial tail is dropped."""
    out: list[Block] = []
    parent: int | None = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        chunk = tuple(tokens[start : start + block_size])
        key = block_key(parent, chunk)
        out.append(Block(key, parent, chunk))
        parent = key
    return out


class PrefixCache:
    def __init__(self, capacity_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if capacity_blocks < 0 or block_size < 1:
            raise ValueError("capacity_blocks must be >= 0 and block_size >= 1")
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        # Insertion order is recency order: the first entry is the next victim.
        self._blocks: OrderedDict[int, Block] = OrderedDict()
        self._observers: list[Observer] = []

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: int) -> bool:
        return key in self._blocks

    def add_observer(self, observer: Observer) -> None:
        self._observers.append(observer)

    def _emit(self, event: CacheEvent) -> None:
        for observer in self._observers:
            observer(event)

    def match_keys(self, keys: Sequence[int]) -> int:
        """Like `match`, for a sequence whose chained block keys are already known (the discrete-event
        experiment hashes each prompt once, not once per lookup). Returns tokens."""
        blocks = self._blocks
        matched = 0
        for key in keys:
            if key not in blocks:
                break
            matched += 1
        return matched * self.block_size

    def match(self, tokens: Sequence[int]) -> int:
        """Cached prefix length in tokens: walks full blocks, stops at the first miss. Does not touch LRU."""
        bs = self.block_size
        parent: int | None = None
        matched = 0
        for start in range(0, len(tokens) - bs + 1, bs):
            key = block_key(parent, tuple(tokens[start : start + bs]))
            if key not in self._blocks:
                break
            matched += bs
            parent = key
        return matched

    def insert(self, tokens: Sequence[int]) -> tuple[list[Block], list[Block]]:
        """Cache every full block of `tokens`; returns (newly stored blocks, evicted blocks)."""
        return self.insert_blocks(iter_blocks(tokens, self.block_size))

    def insert_blocks(self, blocks: Sequence[Block]) -> tuple[list[Block], list[Block]]:
        """`insert` for a sequence's chained blocks computed beforehand (see `iter_blocks`)."""
        blocks = list(blocks[: self.capacity_blocks])
        stored: list[Block] = []
        for block in blocks:
            if block.key not in self._blocks:
                self._blocks[block.key] = block
                stored.append(block)
        # Touch the chain tail-first so the head ends up most recent: eviction then takes the tails of a
        # sequence before its head (as vLLM frees blocks in reverse), never orphaning a reachable suffix.
        for block in reversed(blocks):
            self._blocks.move_to_end(block.key)
        evicted: list[Block] = []
        while len(self._blocks) > self.capacity_blocks:
            _, victim = self._blocks.popitem(last=False)
            evicted.append(victim)
        # Blocks stored and evicted in the same call never existed for an observer.
        evicted_keys = {b.key for b in evicted}
        stored = [b for b in stored if b.key not in evicted_keys]
        if stored:
            self._emit(BlocksStored(tuple(stored)))
        if evicted:
            self._emit(BlocksRemoved(tuple(b.key for b in evicted)))
        return stored, evicted

    def clear(self) -> int:
        """Drop everything; returns how many blocks were cached."""
        n = len(self._blocks)
        self._blocks.clear()
        self._emit(AllBlocksCleared())
        return n
