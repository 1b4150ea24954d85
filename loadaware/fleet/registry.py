"""The fleet: which endpoints exist right now. Sources (a static list, a watched file) feed one registry;
listeners hear about removals so counts and credit end at once."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Callable, Iterable

from loadaware.config import parse_endpoint_list

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


class EndpointsFileWatcher:
    """Re-reads a file of endpoints when its mtime or size changes. A bad file keeps the last good set."""

    def __init__(self, path: str, registry: EndpointRegistry, interval_s: float = 0.5) -> None:
        self.path = path
        self.registry = registry
        self.interval_s = interval_s
        self._stamp: tuple[float, int] | None = None

    def poll(self) -> bool:
        """Read the file if it changed; True when a new set was applied."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            if self._stamp is not None:
                log.warning("endpoints file %s unreadable (%s); keeping the last set", self.path, exc)
                self._stamp = None
            return False
        stamp = (st.st_mtime, st.st_size)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            with open(self.path, encoding="utf-8") as fh:
                text = "\n".join(line.split("#", 1)[0] for line in fh)
            endpoints = parse_endpoint_list(text)
        except (OSError, ValueError) as exc:
            log.warning("endpoints file %s rejected (%s); keeping the last set", self.path, exc)
            return False
        self.registry.set(endpoints)
        return True

    async def run(self) -> None:
        while True:
            self.poll()
            await asyncio.sleep(self.interval_s)
