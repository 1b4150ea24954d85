"""The fleet: which endpoints exist right now. Discovery (a static list, a watched file, Envoy's admin API,
Kubernetes) feeds one registry; subscribers hear each change as it is made (added, removed, then changed
once per new set), so counts and credit end at once and new endpoints are fetched at once: nobody polls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from loadaware.telemetry.faults import RateLimitedLog

log = logging.getLogger(__name__)
_quiet = RateLimitedLog(log)

RemovalListener = Callable[[str], None]


class FleetListener(Protocol):
    def on_added(self, endpoint: str) -> None: ...

    def on_removed(self, endpoint: str) -> None: ...

    def on_changed(self, endpoints: tuple[str, ...]) -> None:
        """After the additions and removals of one new set: the fleet as it is now."""
        ...


def _ignore(_arg: object) -> None:
    pass


class FleetEvents:
    """A listener made of callbacks (any of them may be left out)."""

    def __init__(self, added: Callable[[str], None] = _ignore, removed: Callable[[str], None] = _ignore,
                 changed: Callable[[tuple[str, ...]], None] = _ignore) -> None:
        self._added, self._removed, self._changed = added, removed, changed

    def on_added(self, endpoint: str) -> None:
        self._added(endpoint)

    def on_removed(self, endpoint: str) -> None:
        self._removed(endpoint)

    def on_changed(self, endpoints: tuple[str, ...]) -> None:
        self._changed(endpoints)


class EndpointRegistry:
    def __init__(self, endpoints: Iterable[str] = ()) -> None:
        self._endpoints: tuple[str, ...] = ()
        self._members: frozenset[str] = frozenset()
        self._positions: dict[str, int] | None = None  # built when first asked, per set
        self._lexical: tuple[str, ...] | None = None  # likewise
        self._listeners: list[FleetListener] = []
        self.version = 0
        self.ready = False  # True once a first endpoint set has arrived (even an empty one from a file)
        self.set(endpoints, initial=True)

    def subscribe(self, listener: FleetListener) -> None:
        """Events from now on, in subscription order; the endpoints already there are not replayed (a new
        subscriber reads `snapshot()` first)."""
        self._listeners.append(listener)

    def on_removed(self, listener: RemovalListener) -> None:
        self.subscribe(FleetEvents(removed=listener))

    def set(self, endpoints: Iterable[str], initial: bool = False) -> None:
        new = tuple(dict.fromkeys(endpoints))
        if new == self._endpoints and not initial:
            self.ready = True
            return
        members = frozenset(new)
        removed = [ep for ep in self._endpoints if ep not in members]
        added = [ep for ep in new if ep not in self._members]
        self._endpoints, self._members, self._positions, self._lexical = new, members, None, None
        self.version += 1
        self.ready = self.ready or not initial or bool(new)
        for endpoint in removed:
            for listener in self._listeners:
                self._tell(listener.on_removed, endpoint)
        for endpoint in added:
            for listener in self._listeners:
                self._tell(listener.on_added, endpoint)
        for listener in self._listeners:
            self._tell(listener.on_changed, new)
        if not initial:
            if len(new) + len(removed) <= 64:
                log.info("endpoints now %s (removed %s)", ",".join(new) or "none",
                         ",".join(sorted(removed)) or "none")
            else:  # a large fleet: a line per change, not every address
                log.info("endpoints now %d (%d added, %d removed)", len(new), len(added), len(removed))

    @staticmethod
    def _tell(event: Callable[[Any], None], arg: Any) -> None:
        # One failing listener must not cost the others their event (the fleet would disagree with itself).
        try:
            event(arg)
        except Exception as exc:  # noqa: BLE001 - rate-limited: a broken listener fails on every fleet change
            name = getattr(event, "__name__", "event")
            _quiet.log(logging.ERROR, f"fleet listener {event!r}", "fleet listener failed on %s", name, exc_info=exc)

    def snapshot(self) -> tuple[str, ...]:
        """The endpoints in discovery's order; the same tuple object until the set changes."""
        return self._endpoints

    def members(self) -> frozenset[str]:
        """The endpoints as a set (membership in O(1)); the same object until the set changes."""
        return self._members

    def position(self, endpoint: str) -> int:
        """The endpoint's index in `snapshot()` (len(snapshot()) when it is not a member)."""
        if self._positions is None:
            self._positions = {ep: i for i, ep in enumerate(self._endpoints)}
        return self._positions.get(endpoint, len(self._endpoints))

    def lexical(self) -> tuple[str, ...]:
        """The endpoints in lexical order (round robin's), sorted once per set."""
        if self._lexical is None:
            self._lexical = tuple(sorted(self._endpoints))
        return self._lexical

    def __contains__(self, endpoint: object) -> bool:
        return endpoint in self._members
