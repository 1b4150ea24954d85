"""A vLLM-style GPU prefix cache: fixed-size token blocks, chained keys, LRU eviction.

Pure logic, no I/O and no clocks, so the engine, the unit tests and the discrete-event experiment share it.
A block's key is the builtin hash of (parent key, tuple of its token ids); tuple-of-int hashing does not
depend on PYTHONHASHSEED, so keys are stable across processes. Only full blocks are ever cached, as in vLLM.
A request's `cache_salt` enters the first block's key as vLLM's extra keys `(salt,)` (vLLM:
`generate_block_hash_extra_keys`, salt in the block starting at token 0 only), and every later key chains on
it: a salted prompt only matches blocks cached under the same salt. Salted keys hash a string, so unlike plain
keys they are stable only within one process.
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
    extra: tuple[str, ...] | None = None  # extra keys hashed into the block (vLLM's: the salt, first block only)


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


def block_key(parent: int | None, tokens: tuple[int, ...], extra: tuple[str, ...] | None = None) -> int:
    # A root sentinel of 0 keeps the key an int-only tuple hash (deterministic across processes).
    root = 0 if parent is None else parent
    return hash((root, tokens)) if extra is None else hash((root, tokens, extra))


def salt_extra(salt: str | None) -> tuple[str, ...] | None:
    """vLLM's extra keys of a salted request's first block (no LoRA, no images): `(salt,)`; an empty salt
    counts as none, as in vLLM."""
    return (salt,) if salt else None


def iter_blocks(tokens: Sequence[int], block_size: int, salt: str | None = None) -> list[Block]:
    """Every full block of `tokens` with its chained key; a partial tail is dropped."""
    out: list[Block] = []
    parent: int | None = None
    extra = salt_extra(salt)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        chunk = tuple(tokens[start : start + block_size])
        key = block_key(parent, chunk, extra)
        out.append(Block(key, parent, chunk, extra))
        parent = key
        extra = None
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

    def match(self, tokens: Sequence[int], salt: str | None = None) -> int:
        """Cached prefix length in tokens for a request with cache salt `salt`: walks full blocks, stops at the
        first miss. Does not touch LRU."""
        bs = self.block_size
        parent: int | None = None
        extra = salt_extra(salt)
        matched = 0
        for start in range(0, len(tokens) - bs + 1, bs):
            key = block_key(parent, tuple(tokens[start : start + bs]), extra)
            if key not in self._blocks:
                break
            matched += bs
            parent = key
            extra = None
        return matched

    def insert(self, tokens: Sequence[int], salt: str | None = None) -> tuple[list[Block], list[Block]]:
        """Cache every full block of `tokens` (under `salt`); returns (newly stored blocks, evicted blocks)."""
        return self.insert_blocks(iter_blocks(tokens, self.block_size, salt))

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
