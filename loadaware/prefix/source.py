"""The seam every prefix source implements: "how many of this prompt's tokens does each endpoint hold?"

Sources: the LMCache controller (lmcache.py), and any later index (KV events, approximate). The decision
pipeline only knows this interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class PrefixUnavailable(Exception):
    """The source could not answer in time; the decision falls back to load only."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason  # a short metric label, e.g. lmcache_timeout


class PrefixSource(Protocol):
    name: str

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...]) -> dict[str, int]:
        """Matched prefix tokens per endpoint (absent = 0). Raises PrefixUnavailable."""
        ...
