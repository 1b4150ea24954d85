"""Which engines hold which KV blocks: an exact, multi-holder prefix index. Pure logic, no I/O, no clocks.

Blocks are keyed by the sidecar's OWN chained hash of their token ids (``block_keys``), never by the engine's
block hash: vLLM's hashes depend on its hash seed (and are ints in some versions, bytes in others), ours only
on the tokens. Each engine's map from its hash to our key lets a ``BlockStored`` event follow its parent chain,
and lets ``BlockRemoved`` find what to drop.

The query side is one pass over the request's block keys: an inverted map key -> bitmask of engine slots,
ANDed block after block; an engine's match ends at its first missing block (a prefix cache is only useful up
to the first miss), and every engine that holds the prefix is credited, not just the first one.

Extra keys. vLLM hashes each block as (parent hash, token ids, extra keys), the extra keys being the LoRA
name, multimodal identifiers with their offsets, the request's `cache_salt` (in the block starting at token
0 only) and prompt-embedding hashes, in that order, or None when there are none (`generate_block_hash_extra_keys`
in vllm/v1/core/kv_cache_utils.py); `BlockStored` events carry them per block (`extra_keys`, vLLM PR #33304).
Our keys follow the same rule: a stored block's key includes the extra keys its event names, and a request's
first block key includes `(salt,)` when the request is salted (what vLLM hashes for a salted request with no
LoRA, image or prompt embeddings). Every later key chains on the first, so a salted request walks only
blocks stored under its salt, and an unsalted request never walks a salted chain. Blocks with any other
extra key (LoRA, multimodal, prompt embeddings) get keys no request walk produces: the sidecar cannot know
those inputs, so such blocks are never credited (under-credit, never over-credit).

Used by the KV-events source (loadaware/prefix/kvevents/) and the approximate index (approx.py), and
usable as is by a discrete-event experiment.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

from loadaware.prefix.source import PromptTokens

DEFAULT_BLOCK_SIZE = 16  # vLLM's default
ROOT = 0  # the parent of a chain's first block; keeps plain keys int-only tuple hashes (stable across processes)

EngineHash = int | bytes  # vLLM's ExternalBlockHash

# Media: a block may sit on the GPU and, offloaded, in CPU memory at once; a removal from one medium must
# not drop the other. None is what older vLLM versions send, and means the GPU.
MEDIUM_GPU, MEDIUM_CPU, MEDIUM_OTHER = 1, 2, 4
_MEDIUM_BITS = {None: MEDIUM_GPU, "GPU": MEDIUM_GPU, "gpu": MEDIUM_GPU, "CPU": MEDIUM_CPU, "cpu": MEDIUM_CPU}

# Rough CPython costs, calibrated with tracemalloc in tests/unit/test_kv_index.py: one engine entry
# (a dict slot + the packed int + the engine hash object, bytes hashes being the larger) and one inverted-map
# entry (a dict slot + the key int + the mask int). Reported, not enforced: the bound is in blocks.
BYTES_PER_ENGINE_BLOCK = 255
BYTES_PER_HELD_KEY = 130
# Keys unheld per slice of a deferred drop: ~0.3 µs each, so a slice stays well under 10 ms of the loop.
SWEEP_SLICE_KEYS = 16_384


def medium_bit(medium: str | None) -> int:
    return _MEDIUM_BITS.get(medium, MEDIUM_OTHER)


def block_key(parent: int, tokens: tuple[int, ...], extra: Hashable = None) -> int:
    """Our key for one block. `extra` (vLLM's extra keys for the block: LoRA name, multimodal identifiers,
    cache salt, prompt-embedding hashes) changes the KV the block holds, so such blocks get keys a plain token
    walk never produces: no phantom credit for them. A salted request's walk produces the salted first key
    (`block_keys(..., salt=...)`)."""
    return hash((parent, tokens)) if extra is None else hash((parent, tokens, extra))


def first_block_extra(salt: str | None) -> tuple[str] | None:
    """The extra keys vLLM hashes into the first block of a request whose only extra input is its cache salt:
    `(salt,)`; None for an unsalted request (vLLM skips an empty salt too)."""
    return (salt,) if salt else None


def block_keys(tokens: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE, limit: int | None = None,
               salt: str | None = None) -> list[int]:
    """Chained keys of every full block of `tokens` (a partial tail has none, as in vLLM), for a request with
    cache salt `salt`: the salt enters the first block's key, and through the chain every later one."""
    n = len(tokens) // block_size
    if limit is not None:
        n = min(n, limit)
    keys: list[int] = []
    parent = ROOT
    # Slicing a tuple yields a tuple: one conversion for the whole prompt, not one per block.
    whole = tokens if isinstance(tokens, tuple) else tuple(tokens)
    first = 0
    extra = first_block_extra(salt)
    if extra is not None and n:
        parent = block_key(ROOT, whole[:block_size], extra)
        keys.append(parent)
        first = block_size
    for start in range(first, n * block_size, block_size):
        parent = hash((parent, whole[start:start + block_size]))
        keys.append(parent)
    return keys


def chain_keys(tokens: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE, salt: str | None = None) -> list[int]:
    """block_keys, computed once per decision: a decision's token list (source.PromptTokens) keeps the chain
    of each block size and salt it was walked with; any other sequence is walked afresh."""
    if not isinstance(tokens, PromptTokens):
        return block_keys(tokens, block_size, salt=salt)
    memo = (block_size, salt)
    keys = tokens.chains.get(memo)
    if keys is None:
        keys = tokens.chains[memo] = block_keys(tokens, block_size, salt=salt)
    return keys


def walk(holders: dict[int, int], names: dict[int, str], alive: int, keys: Sequence[int],
         block_size: int) -> dict[str, int]:
    """One pass over a request's block keys: `holders` maps a key to a bitmask of engine slots, `alive` is
    the slots still in the race. An engine drops out at its first missing block; its match is what came
    before. Returns matched tokens per engine name (slots that matched nothing are left out)."""
    out: dict[str, int] = {}
    if not alive:
        return out
    for i, key in enumerate(keys):
        held = holders.get(key, 0) & alive
        if held != alive:
            lost = alive ^ held
            if i:
                while lost:
                    low = lost & -lost
                    out[names[low.bit_length() - 1]] = i * block_size
                    lost ^= low
            alive = held
            if not alive:
                return out
    matched = len(keys) * block_size
    while alive:
        low = alive & -alive
        out[names[low.bit_length() - 1]] = matched
        alive ^= low
    return out


class SlotTable:
    """Engine name <-> bit position in the holder masks; freed positions are reused."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self._bits: dict[str, int] = {}
        self._free: list[int] = []
        self._next = 0

    def bit(self, name: str) -> int:
        bit = self._bits.get(name)
        if bit is None:
            slot = self._free.pop() if self._free else self._next
            if slot == self._next:
                self._next += 1
            bit = self._bits[name] = 1 << slot
            self.names[slot] = name
        return bit

    def every_bit(self) -> int:
        """A mask of every slot ever handed out. A walk may start from it: a free slot is held by no key, so
        it drops out at the first block, as does an engine that holds nothing."""
        return (1 << self._next) - 1

    def release(self, name: str) -> None:
        slot = self.retire(name)
        if slot is not None:
            self.free(slot)

    def retire(self, name: str) -> int | None:
        """Unname `name`'s slot without freeing it (its bit is still in some masks); `name` may get a new
        slot meanwhile. Returns the slot, to `free` once no mask holds its bit."""
        bit = self._bits.pop(name, None)
        if bit is None:
            return None
        slot = bit.bit_length() - 1
        del self.names[slot]
        return slot

    def free(self, slot: int) -> None:
        self._free.append(slot)


def unhold(holders: dict[int, int], key: int, bit: int) -> None:
    mask = holders.get(key, 0) & ~bit
    if mask:
        holders[key] = mask
    else:
        holders.pop(key, None)


@dataclass(slots=True)
class StoreResult:
    stored: int = 0  # blocks new to this engine (on some medium)
    orphans: int = 0  # blocks whose parent this engine's index does not know: not indexed
    evicted: int = 0  # entries dropped to stay within the memory bound


class _Engine:
    __slots__ = ("bit", "block_size", "blocks", "name", "refs")

    def __init__(self, name: str, bit: int) -> None:
        self.name = name
        self.bit = bit
        self.block_size = DEFAULT_BLOCK_SIZE
        # engine hash -> (our key << 3) | media bits: one dict slot and one int per block
        self.blocks: dict[EngineHash, int] = {}
        # our key -> how many engine hashes map to it (almost always 1; >1 only if two engine hashes carry
        # the same tokens and extra keys, e.g. a salt an older vLLM does not publish): the key stays held
        # until the last one goes
        self.refs: dict[int, int] = {}


DEFAULT_MAX_BLOCKS = 1_500_000  # --kv-events-max-blocks' default: fits the shipped manifests (docs/memory.md)


class BlockIndex:
    """Per-engine cached blocks plus an inverted key -> engines map. `max_blocks` bounds the sum over engines
    of indexed blocks; an engine that stores past it loses its own oldest entries (it is the one growing).
    Losing an entry can only under-credit, never credit a block that is not there."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")
        self.max_blocks = max_blocks
        self._holders: dict[int, int] = {}  # our key -> bitmask of engine slots holding it
        self._engines: dict[str, _Engine] = {}
        self._slots = SlotTable()
        self.total_blocks = 0
        self.evictions = 0
        # Dropped engines' keys still to unhold, slot by slot: (slot, bit, keys left). While a slot waits here
        # no live engine has its bit, so no walk is credited by what is left of it.
        self._retired: deque[tuple[int, int, Iterator[int]]] = deque()
        # Set by whoever drives `sweep` (the KV-event feeds, on the event loop): drops are then deferred and
        # done in slices. None: a drop unholds everything at once (pure use, the experiment).
        self.on_retired: Callable[[], None] | None = None

    # ---- engines ----
    def _engine(self, name: str) -> _Engine:
        engine = self._engines.get(name)
        if engine is None:
            engine = self._engines[name] = _Engine(name, self._slots.bit(name))
        return engine

    def engines(self) -> list[str]:
        return list(self._engines)

    def blocks(self, name: str) -> int:
        engine = self._engines.get(name)
        return 0 if engine is None else len(engine.blocks)

    def block_size(self, name: str) -> int | None:
        engine = self._engines.get(name)
        return None if engine is None else engine.block_size

    def clear(self, name: str) -> int:
        """Forget everything `name` holds (AllBlocksCleared, a restart, an unrecoverable gap); returns how
        many blocks were dropped. The engine keeps its slot."""
        engine = self._engines.get(name)
        if engine is None:
            return 0
        n = len(engine.blocks)
        if engine.refs:
            self._retire(engine)
            engine.bit = self._slots.bit(name)  # a fresh slot: the old bit's masks are unheld meanwhile
        engine.blocks = {}
        engine.refs = {}
        self.total_blocks -= n
        return n

    def drop(self, name: str) -> int:
        """The endpoint left the fleet: clear it and free its slot."""
        n = self.clear(name)
        if self._engines.pop(name, None) is not None:
            self._slots.release(name)
        return n

    def _retire(self, engine: _Engine) -> None:
        slot = self._slots.retire(engine.name)
        assert slot is not None
        self._retired.append((slot, engine.bit, iter(engine.refs)))
        if self.on_retired is None:
            while self.sweep(SWEEP_SLICE_KEYS):
                pass
        else:
            self.on_retired()

    def sweep(self, max_keys: int = SWEEP_SLICE_KEYS) -> bool:
        """Unhold up to `max_keys` keys of dropped engines, freeing each slot when its keys are done. Returns
        True while some remain (the caller yields to the loop between slices)."""
        holders = self._holders
        budget = max_keys
        while self._retired and budget > 0:
            slot, bit, keys = self._retired[0]
            done = 0
            for key in islice(keys, budget):
                unhold(holders, key, bit)
                done += 1
            budget -= done
            if budget > 0:  # the iterator ran out before the budget did: this slot is clean
                self._retired.popleft()
                self._slots.free(slot)
        return bool(self._retired)

    # ---- events ----
    def store(self, name: str, block_hashes: Sequence[EngineHash], parent_hash: EngineHash | None,
              token_ids: Sequence[int], block_size: int, medium: str | None = None,
              extra: Sequence[Hashable] | None = None) -> StoreResult:
        """One BlockStored event. `extra` is None (plain blocks) or one value per block: the block's extra
        keys as vLLM hashed them (None for a plain block; see codec.BlockStored.extra). A sequence that does
        not line up with the blocks marks every block, so none of them is ever credited."""
        engine = self._engine(name)
        result = StoreResult()
        if block_size < 1 or not block_hashes:
            return result
        engine.block_size = block_size
        bit = medium_bit(medium)
        blocks = engine.blocks
        if parent_hash is None:
            parent = ROOT
        else:
            packed = blocks.get(parent_hash)
            if packed is None:
                result.orphans = len(block_hashes)  # we missed its parent: its chain is unknown to us
                return result
            parent = packed >> 3
        if extra is not None and len(extra) != len(block_hashes):
            extra = (("unaligned_extra_keys", tuple(extra)),) * len(block_hashes)
        tokens = token_ids if isinstance(token_ids, tuple) else tuple(token_ids)
        holders = self._holders
        refs = engine.refs
        mine = engine.bit
        total = self.total_blocks  # stored once, at the end: /debug/state reads it from its render thread
        for i, engine_hash in enumerate(block_hashes):
            chunk = tokens[i * block_size:(i + 1) * block_size]
            if len(chunk) < block_size:
                result.orphans += len(block_hashes) - i  # a short token list: the rest have no tokens
                break
            key = block_key(parent, chunk, None if extra is None else extra[i])
            packed = blocks.get(engine_hash)
            if packed is not None and packed >> 3 == key:
                blocks[engine_hash] = packed | bit
            else:
                if packed is not None:  # same engine hash, other tokens: the newer event wins
                    self._unref(engine, packed >> 3)
                    total -= 1
                blocks[engine_hash] = (key << 3) | bit
                total += 1
                refs[key] = refs.get(key, 0) + 1
                holders[key] = holders.get(key, 0) | mine
                result.stored += 1
            parent = key
        if total > self.max_blocks:
            result.evicted = self._shrink(engine, total - self.max_blocks)
        self.total_blocks = total - result.evicted
        return result

    def remove(self, name: str, block_hashes: Iterable[EngineHash], medium: str | None = None) -> int:
        """One BlockRemoved event; returns how many blocks left this engine entirely."""
        engine = self._engines.get(name)
        if engine is None:
            return 0
        bit = medium_bit(medium)
        blocks = engine.blocks
        gone = 0
        for engine_hash in block_hashes:
            packed = blocks.get(engine_hash)
            if packed is None:
                continue
            left = packed & ~bit
            if left & 7:
                blocks[engine_hash] = left
                continue
            del blocks[engine_hash]
            self._unref(engine, packed >> 3)
            gone += 1
        self.total_blocks -= gone
        return gone

    def _unref(self, engine: _Engine, key: int) -> None:
        count = engine.refs.get(key, 0) - 1
        if count > 0:
            engine.refs[key] = count
            return
        engine.refs.pop(key, None)
        unhold(self._holders, key, engine.bit)

    def _shrink(self, engine: _Engine, excess: int) -> int:
        # Oldest first (dict order is insertion order); a batch at once keeps the cost amortized. The caller
        # takes the victims off the total.
        batch = max(excess, min(len(engine.blocks), max(64, len(engine.blocks) // 100)))
        victims = list(islice(engine.blocks.items(), batch))
        for engine_hash, packed in victims:
            del engine.blocks[engine_hash]
            self._unref(engine, packed >> 3)
        self.evictions += len(victims)
        return len(victims)

    # ---- queries (hot path) ----
    def match(self, keys: Sequence[int], block_size: int, endpoints: Iterable[str]) -> dict[str, int]:
        """Matched prompt tokens for every endpoint in `endpoints` whose index uses `block_size` and holds
        the first block(s) of `keys`; an endpoint absent from the answer holds none."""
        alive = 0
        engines = self._engines
        for name in endpoints:
            engine = engines.get(name)
            if engine is not None and engine.block_size == block_size and engine.blocks:
                alive |= engine.bit
        return walk(self._holders, self._slots.names, alive, keys, block_size)

    # ---- reporting ----
    def approx_bytes(self) -> int:
        return self.total_blocks * BYTES_PER_ENGINE_BLOCK + len(self._holders) * BYTES_PER_HELD_KEY

    def held_keys(self) -> int:
        return len(self._holders)
