"""--endpoints-file: the fleet as a file of endpoints, re-read when it changes."""

from __future__ import annotations

import asyncio
import logging
import os

from loadaware.fleet.addresses import parse_endpoint_list
from loadaware.fleet.registry import EndpointRegistry

log = logging.getLogger(__name__)


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
