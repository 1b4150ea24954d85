"""REFERENCE ONLY: the approximate index as it was before its recency was kept in runs (commit 3d944a1), one
ordered entry per block. tests/unit/test_approx_equivalence.py checks that the index in loadaware/prefix/approx.py
answers, evicts and ages exactly as this one did. Not imported by the product."""


from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from loadaware.fleet.members import member_set
from loadaware.prefix.blocks import SlotTable, block_keys, chain_keys, unhold, walk

# Rough CPython cost of one guessed block: an OrderedDict entry (key, float, links) + an inverted-map entry.
BYTES_PER_APPROX_BLOCK = 200


class _Guess:
    __slots__ = ("bit", "blocks")

    def __init__(self, bit: int) -> None:
        self.bit = bit
        self.blocks: OrderedDict[int, float] = OrderedDict()  # key -> when last routed; oldest first


class ApproxIndex:
    """`capacity_blocks` bounds each engine's guess; `max_blocks` the sum over engines, so the memory bound
    does not grow with the fleet. An engine recorded past either bound loses its own oldest blocks."""

    def __init__(self, capacity_blocks: int, block_size: int, ttl_s: float, max_blocks: int | None = None) -> None:
        if capacity_blocks < 1 or block_size < 1 or ttl_s <= 0 or (max_blocks is not None and max_blocks < 1):
            raise ValueError("capacity_blocks, block_size, ttl_s and max_blocks must be positive")
        self.capacity_blocks = capacity_blocks
        self.max_blocks = max_blocks  # None: no bound on the sum (a simulation with a fixed fleet)
        self.total_blocks = 0
        self.block_size = block_size
        self.ttl_s = ttl_s
        self._holders: dict[int, int] = {}
        self._engines: dict[str, _Guess] = {}
        self._slots = SlotTable()
        self.evicted = {"capacity": 0, "decay": 0, "endpoint_removed": 0}

    def keys(self, tokens: Sequence[int], salt: str | None = None) -> list[int]:
        if len(tokens) // self.block_size <= self.capacity_blocks:  # the whole chain: shared with other indexes
            return chain_keys(tokens, self.block_size, salt)
        return block_keys(tokens, self.block_size, limit=self.capacity_blocks, salt=salt)

    def record(self, engine: str, keys: Sequence[int], now: float) -> int:
        """The request with these block keys was routed to `engine`; returns blocks evicted for capacity."""
        guess = self._engines.get(engine)
        if guess is None:
            guess = self._engines[engine] = _Guess(self._slots.bit(engine))
        blocks, holders, bit = guess.blocks, self._holders, guess.bit
        # Tail first, so the chain's head ends up most recent: an engine evicts a sequence's tail before
        # its head (as vLLM frees blocks in reverse), and a walk stops at the first miss anyway.
        before = len(blocks)
        for key in reversed(keys):
            if key in blocks:
                blocks.move_to_end(key)
            else:
                holders[key] = holders.get(key, 0) | bit
            blocks[key] = now
        self.total_blocks += len(blocks) - before
        evicted = 0
        excess = len(blocks) - self.capacity_blocks
        if self.max_blocks is not None:
            excess = max(excess, self.total_blocks - self.max_blocks)
        while excess > 0 and blocks:
            key, _ = blocks.popitem(last=False)
            unhold(holders, key, bit)
            evicted += 1
            excess -= 1
        self.total_blocks -= evicted
        self.evicted["capacity"] += evicted
        return evicted

    def expire(self, now: float) -> int:
        """Forget guesses older than ttl_s; returns how many."""
        horizon = now - self.ttl_s
        dropped = 0
        for guess in self._engines.values():
            blocks = guess.blocks
            while blocks:
                key, at = next(iter(blocks.items()))
                if at >= horizon:
                    break
                del blocks[key]
                unhold(self._holders, key, guess.bit)
                dropped += 1
        self.total_blocks -= dropped
        self.evicted["decay"] += dropped
        return dropped

    def drop(self, engine: str) -> int:
        guess = self._engines.pop(engine, None)
        if guess is None:
            return 0
        for key in guess.blocks:
            unhold(self._holders, key, guess.bit)
        self._slots.release(engine)
        self.total_blocks -= len(guess.blocks)
        self.evicted["endpoint_removed"] += len(guess.blocks)
        return len(guess.blocks)

    def match(self, keys: Sequence[int], endpoints: Sequence[str]) -> dict[str, int]:
        engines = self._engines
        if len(engines) < len(endpoints):
            # Fewer guessed engines than endpoints asked about (a large fleet): walk them all and keep the
            # asked ones. Each engine's match is its own, so the others' presence changes nothing.
            if not keys:
                return {}
            members = member_set(endpoints)
            found = walk(self._holders, self._slots.names, self._slots.every_bit(), keys, self.block_size)
            return {ep: n for ep, n in found.items() if ep in members}
        alive = 0
        for name in endpoints:
            guess = engines.get(name)
            if guess is not None and guess.blocks:
                alive |= guess.bit
        return walk(self._holders, self._slots.names, alive, keys, self.block_size)

    def blocks(self, engine: str) -> int:
        guess = self._engines.get(engine)
        return 0 if guess is None else len(guess.blocks)

    def engines(self) -> list[str]:
        return list(self._engines)

    def approx_bytes(self) -> int:
        return self.total_blocks * BYTES_PER_APPROX_BLOCK
