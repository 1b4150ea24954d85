"""The fleet: which endpoints exist right now. Discovery (a static list, a watched file, Envoy's admin API,
Kubernetes) feeds one registry; listeners hear about removals so counts and credit end at once."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

RemovalListener = Callable[[str], None]


class EndpointRegistry:
    def __init__(self, endpoints: Iterable[str] = ()) -> None:
        self._endpoints: tuple[str, ...] = ()
        self._listeners: list[RemovalListener] = []
        self.version = 0
        self.ready = False  # True once a first endpoint set has arrived (even an empty one from a file)
        self.set(endpoints, initial=True)

    def on_removed(self, listener: RemovalListener) -> None:
        self._listeners.append(listener)

    def set(self, endpoints: Iterable[str], initial: bool = False) -> None:
        new = tuple(dict.fromkeys(endpoints))
        if new == self._endpoints and not initial:
            self.ready = True
            return
        removed = set(self._endpoints) - set(new)
        self._endpoints = new
        self.version += 1
        self.ready = self.ready or not initial or bool(new)
        for endpoint in removed:
            for listener in self._listeners:
                listener(endpoint)
        if not initial:
            log.info("endpoints now %s (removed %s)", ",".join(new) or "none", ",".join(sorted(removed)) or "none")

    def snapshot(self) -> tuple[str, ...]:
        return self._endpoints
