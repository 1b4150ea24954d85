"""An endpoint tuple as a set, cached by identity: the registry hands out the same tuple until the fleet
changes, so a source asked about the whole fleet on every decision builds its set once per change."""

from __future__ import annotations

from collections.abc import Collection, Sequence

_cached: tuple[Sequence[str], frozenset[str]] | None = None


def member_set(endpoints: Sequence[str]) -> Collection[str]:
    global _cached
    if _cached is not None and _cached[0] is endpoints:
        return _cached[1]
    members = frozenset(endpoints)
    if isinstance(endpoints, tuple):  # immutable: safe to keep; a list could change under the cache
        _cached = (endpoints, members)
    return members
