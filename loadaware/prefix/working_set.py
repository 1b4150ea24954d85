"""The fleet's prefix working set, estimated from the prompts the router sends: does every prefix that comes
back fit in the fleet's KV caches once, with room for more copies? And how often has this prompt's prefix
been routed lately?

A sample of each prompt's blocks is tracked, not all of them: every `stride`-th block (block 0, stride,
2 x stride, ...), each keyed by the blocks sampled before it and its own tokens (`sampled_keys`), then, once
the fleet's caches are large, only keys divisible by a power of two `mod` (SHARDS' spatial sampling,
Waldspurger et al., FAST '15: a key kept at one rate is kept at every lower power-of-two rate, so raising the
rate only drops entries). An LRU over the sampled keys, spanning `window` fleet capacities of blocks, counts
how often each was routed while recent:

- recurring: the blocks of sampled keys routed again while still in the LRU, each key standing for the
  `stride` blocks from its own (fewer at a prompt's end), x mod: the blocks that come back soon enough to be
  worth caching (a request's unique suffix never counts). On the placement grid's workloads it follows the
  count over every block (stride 1) to within 3% (research/notebook.md). A key that straddles a prefix's end
  counts the prompt's tail as recurring, so where prefixes are short and tails long it over-counts, which
  makes `lane-spread` fall back to `lane` sooner, never later.
- popularity(keys, matched): the count of the deepest sampled key inside the prompt's longest match, an
  upper bound on how often that prefix itself was routed (a block's count is at least its descendants').
- heads: how often each prompt head (block 0) was seen; while any seen head was seen only once (f1 > 0 in a
  species count), new prefixes are still arriving and the working set may be growing (a cold start).

Pure and bounded: at most `max_entries` sampled keys and `max_entries` heads. Capacity in tokens comes from
the engines' `vllm:cache_config_info` (num_gpu_blocks x block_size, loadaware/load/vllm_metrics.py).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from loadaware.policies.base import Candidate

STRIDE = 16  # blocks between sampled blocks: a 1,544-token prompt hashes 6 blocks, not 96
BLOCK_TOKENS = 16  # tokens per sampled block (the estimator's unit, independent of the engines' block size)
WINDOW = 2.0  # the LRU's span in fleet capacities: a block whose reuse distance is longer would miss anyway
MAX_ENTRIES = 1 << 16  # sampled keys and heads each (~180 bytes an entry: ~24 MB in all)
_WEIGHT = 0xFF  # the low byte of an LRU value: the blocks its key stands for (so stride <= 255)


def sampled_keys(tokens: Sequence[int], salt: str | None = None, stride: int = STRIDE,
                 block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """The keys of blocks 0, stride, 2 x stride, ... of `tokens` (full blocks only), each chained on the
    sampled keys before it and on the request's cache salt, which keys an engine's cache too."""
    keys: list[int] = []
    parent: object = salt
    step = stride * block_tokens
    for start in range(0, len(tokens) - block_tokens + 1, step):
        parent = hash((parent, tuple(tokens[start:start + block_tokens])))
        keys.append(parent)
    return keys


class WorkingSet:
    def __init__(self, stride: int = STRIDE, window: float = WINDOW, max_entries: int = MAX_ENTRIES) -> None:
        if not 1 <= stride <= _WEIGHT or window <= 0 or max_entries < 1:
            raise ValueError(f"1 <= stride <= {_WEIGHT}, window > 0 and max_entries >= 1 are required")
        self.stride = stride
        self.window = window
        self.max_entries = max_entries
        self.capacity_blocks = 0.0  # the fleet's KV capacity in estimator blocks (0: unknown)
        self.mod = 1  # keys kept: those divisible by mod (a power of two)
        # sampled key -> (times routed while in the LRU) << 8 | (blocks it stands for): the key of block p
        # stands for blocks p .. p + stride - 1 of the prompt that last routed it (fewer at the prompt's end),
        # so the LRU spans `window` capacities of blocks, not of keys, and a short tail weighs what it holds.
        self._lru: OrderedDict[int, int] = OrderedDict()
        self.blocks = 0  # the blocks the LRU's keys stand for
        self.recurring = 0  # of them, those of keys routed at least twice
        self._heads: OrderedDict[int, int] = OrderedDict()  # block 0's key -> times seen
        self.singletons = 0  # heads seen exactly once
        self._span = math.inf  # the LRU's span in blocks (set_capacity)

    # ---- what the router tells it ----
    def set_capacity(self, capacity_blocks: float) -> None:
        """The fleet's KV capacity, in blocks of the estimator's size; the LRU's span follows it."""
        self.capacity_blocks = max(0.0, capacity_blocks)
        mod = self.mod
        while self.window * self.capacity_blocks / (self.stride * mod) > self.max_entries:
            mod *= 2
        if mod != self.mod:
            self.mod = mod
            self._lru = OrderedDict((k, v) for k, v in self._lru.items() if k % mod == 0)
            self.blocks = sum(v & _WEIGHT for v in self._lru.values())
            self.recurring = sum(v & _WEIGHT for v in self._lru.values() if v >> 8 >= 2)
        # The LRU's span in blocks; until the capacity is known it fills up to max_entries keys.
        self._span = self.window * self.capacity_blocks / mod if self.capacity_blocks else math.inf
        self._trim()

    def observe(self, keys: Sequence[int], blocks: int) -> None:
        """A request was routed: its prompt's sampled keys (sampled_keys) and its number of full blocks."""
        if not keys:
            return
        heads = self._heads
        seen = heads.pop(keys[0], 0) + 1
        heads[keys[0]] = seen
        if seen <= 2:
            self.singletons += 1 if seen == 1 else -1
            if len(heads) > self.max_entries and heads.popitem(last=False)[1] == 1:
                self.singletons -= 1
        lru, mod, stride = self._lru, self.mod, self.stride
        last = len(keys) - 1
        added = recurring = 0  # summed here, stored once: this runs for every routed request
        for j, k in enumerate(keys):
            if mod > 1 and k % mod:
                continue
            weight = stride if j < last else max(1, min(stride, blocks - j * stride))
            old = lru.pop(k, 0)
            lru[k] = ((old >> 8) + 1) << 8 | weight
            added += weight - (old & _WEIGHT)
            if old >= 512:  # routed twice before: recurring already, at its old weight
                recurring += weight - (old & _WEIGHT)
            elif old:  # its second time: recurring from now on
                recurring += weight
        self.blocks += added
        self.recurring += recurring
        if self.blocks > self._span or len(lru) > self.max_entries:
            self._trim()

    def _trim(self) -> None:
        lru, span = self._lru, self._span
        while lru and (self.blocks > span or len(lru) > self.max_entries):
            v = lru.popitem(last=False)[1]
            self.blocks -= v & _WEIGHT
            if v >> 8 >= 2:
                self.recurring -= v & _WEIGHT

    # ---- what a decision reads ----
    def recurring_blocks(self) -> float:
        """Estimated blocks of the recurring working set."""
        return float(self.recurring * self.mod)

    def demand(self) -> float | None:
        """The recurring working set over the fleet's KV capacity; None while that is unknown or while some
        prompt head has been seen only once (the working set may still be growing)."""
        if self.capacity_blocks <= 0 or self.singletons > 0 or not self._heads:
            return None
        return self.recurring_blocks() / self.capacity_blocks

    def popularity(self, keys: Sequence[int], matched_blocks: int) -> int:
        """Times the prompt's held prefix was routed lately: the count of the deepest tracked sampled key
        within its first `matched_blocks` blocks (0 when none is)."""
        if matched_blocks < 1 or not keys:
            return 0
        lru, mod = self._lru, self.mod
        for j in range(min(len(keys), (matched_blocks - 1) // self.stride + 1) - 1, -1, -1):
            k = keys[j]
            if mod == 1 or k % mod == 0:
                return lru.get(k, 0) >> 8
        return 0

    def state(self) -> dict[str, object]:
        return {"capacity_blocks": self.capacity_blocks, "recurring_blocks": self.recurring_blocks(),
                "demand": self.demand(), "sampled_keys": len(self._lru), "sample_mod": self.mod,
                "stride": self.stride, "heads": len(self._heads), "singleton_heads": self.singletons}


def fill_candidates(candidates: Sequence[Candidate], working_set: WorkingSet, keys: Sequence[int]) -> None:
    """Set the working set's two values on every candidate of a decision (they are the same on each): the
    fleet's cache demand, and the popularity of the prompt's prefix held deepest anywhere in the fleet."""
    if not candidates:
        return
    demand, routes = working_view(working_set, keys, max(c.matched_tokens for c in candidates))
    for c in candidates:
        c.cache_demand = demand
        c.prefix_routes = routes


def working_view(working_set: WorkingSet, keys: Sequence[int], deepest_tokens: int) -> tuple[float | None, float]:
    """(the fleet's cache demand, the popularity of the prompt's prefix held to `deepest_tokens`)."""
    return working_set.demand(), float(working_set.popularity(keys, deepest_tokens // BLOCK_TOKENS))
