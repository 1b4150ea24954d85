"""LMCache chunk keys and a simulated LMCache CPU store (LRU over chunk keys).

Key scheme, read from lmcache 0.5.6 (`lmcache/v1/token_database.py`): the controller's KVController builds a
`ChunkedTokenDatabase()` with no config, so chunk_size = 256 and the hash function is the builtin `hash`
(vLLM is not installed in the controller, so NONE_HASH = 0). Key i = hash((key_{i-1}, tuple(chunk), ()))
with key_{-1} = NONE_HASH. The controller also hashes a partial trailing chunk when it looks up, but an
engine only ever admits full chunks here, so a partial tail never matches.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

LMCACHE_CHUNK_SIZE = 256
NONE_HASH = 0


def chunk_keys(tokens: Sequence[int], chunk_size: int = LMCACHE_CHUNK_SIZE) -> list[int]:
    """Chained keys of every full chunk of `tokens` (a partial trailing chunk gets none)."""
    keys: list[int] = []
    prefix = NONE_HASH
    for start in range(0, len(tokens) - chunk_size + 1, chunk_size):
        # The empty tuple is LMCache's canonical "no extra keys" (multimodal / LoRA) slot.
        prefix = hash((prefix, tuple(tokens[start : start + chunk_size]), ()))
        keys.append(prefix)
    return keys


class LMCacheStore:
    """The chunk keys one engine's LMCache CPU backend holds, LRU-evicted at `capacity_chunks`."""

    def __init__(self, capacity_chunks: int, chunk_size: int = LMCACHE_CHUNK_SIZE) -> None:
        if capacity_chunks < 0:
            raise ValueError("capacity_chunks must be >= 0")
        self.capacity_chunks = capacity_chunks
        self.chunk_size = chunk_size
        self._keys: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def keys(self) -> list[int]:
        return list(self._keys)

    def match(self, tokens: Sequence[int]) -> int:
        """Tokens of `tokens`' prefix held here (whole chunks, stops at the first miss)."""
        matched = 0
        for key in chunk_keys(tokens, self.chunk_size):
            if key not in self._keys:
                break
            matched += self.chunk_size
        return matched

    def match_keys(self, keys: Sequence[int]) -> int:
        """`match` for chunk keys computed beforehand (see `chunk_keys`). Returns tokens."""
        held = self._keys
        matched = 0
        for key in keys:
            if key not in held:
                break
            matched += 1
        return matched * self.chunk_size

    def admit(self, tokens: Sequence[int]) -> tuple[list[int], list[int]]:
        """Store the full chunks of `tokens`; returns (newly admitted keys, evicted keys)."""
        return self.admit_keys(chunk_keys(tokens, self.chunk_size))

    def admit_keys(self, keys: Sequence[int]) -> tuple[list[int], list[int]]:
        keys = list(keys)[: self.capacity_chunks]
        admitted = [k for k in keys if k not in self._keys]
        for k in admitted:
            self._keys[k] = None
        # Head of the chain most recent, so eviction eats suffixes first (a lookup walk stops at the first
        # miss, so an evicted head would make its whole suffix useless).
        for k in reversed(keys):
            self._keys.move_to_end(k)
        evicted: list[int] = []
        while len(self._keys) > self.capacity_chunks:
            victim, _ = self._keys.popitem(last=False)
            evicted.append(victim)
        # A key admitted and evicted in the same call never existed for the controller.
        gone, new = set(evicted), set(admitted)
        return [k for k in admitted if k not in gone], [k for k in evicted if k not in new]

    def clear(self) -> list[int]:
        """Drop every key; returns them so the controller can be told."""
        evicted = list(self._keys)
        self._keys.clear()
        return evicted
