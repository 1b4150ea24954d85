"""KV blocks held by in-flight requests, as vLLM's `vllm:kv_cache_usage_perc` counts them. Pure logic.

vLLM (v1, `BlockPool.get_usage`) reports usage = 1 - free blocks / usable blocks, and a block leaves the free
queue only while some request references it: a prefix block every in-flight request has released stays
cached (a later request can hit it) but sits in the free queue, evictable, so it is NOT usage. A block shared
by several in-flight requests (a common prefix) is one block. So usage is the distinct full prompt blocks the
in-flight requests hold, plus each one's partial last prompt block and its output's blocks, over the pool.
"""

from __future__ import annotations

from collections.abc import Iterable


class HeldBlocks:
    """Reference counts of full prompt blocks (by chained key) plus a count of unshared blocks."""

    __slots__ = ("_refs", "private")

    def __init__(self) -> None:
        self._refs: dict[int, int] = {}
        self.private = 0  # partial last prompt blocks and output blocks: never shared

    def hold(self, keys: Iterable[int]) -> None:
        refs = self._refs
        for k in keys:
            refs[k] = refs.get(k, 0) + 1

    def release(self, keys: Iterable[int]) -> None:
        refs = self._refs
        for k in keys:
            left = refs[k] - 1
            if left:
                refs[k] = left
            else:
                del refs[k]

    def __len__(self) -> int:
        """Distinct blocks held: shared prefix blocks once, plus every private block."""
        return len(self._refs) + self.private

    def usage(self, capacity_blocks: int, more_private: int = 0) -> float:
        """vllm:kv_cache_usage_perc for a pool of `capacity_blocks` (0..1); `more_private`: unshared blocks
        counted by the caller instead of in `private` (the DES sums them only when it samples)."""
        return min(1.0, (len(self) + more_private) / max(1, capacity_blocks))


def private_blocks(prompt_tokens: int, produced: int, block_size: int) -> int:
    """Blocks a request holds alone: its partial last prompt block together with its output tokens."""
    return -(-((prompt_tokens % block_size) + produced) // block_size)
