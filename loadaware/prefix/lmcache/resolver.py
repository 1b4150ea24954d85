"""Keeps the instance-id bridge fresh from the controller's worker list, in the background."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from loadaware.prefix.lmcache.bridge import InstanceBridge, WorkerRecord
from loadaware.prefix.lmcache.client import LMCacheClient

log = logging.getLogger(__name__)


class InstanceResolver:
    """Keeps an InstanceBridge fresh: a periodic full refresh, plus prompt targeted refreshes when a
    decision met an unknown holder or the fleet has unmapped endpoints. Requests never wait on it."""

    def __init__(self, client: LMCacheClient, bridge: InstanceBridge, period_s: float,
                 min_gap_s: float = 2.0) -> None:
        self.client = client
        self.bridge = bridge
        self.period_s = period_s
        self.min_gap_s = min_gap_s
        self._wake = asyncio.Event()
        self._pending_ids: set[str] = set()
        self._asked: dict[str, float] = {}
        self._last_full = 0.0
        self._full_wanted = True
        self.refreshes = 0
        self.attempts = 0  # readiness waits for the first attempt, successful or not (fail open)

    def report_unknown(self, instance_ids: Sequence[str]) -> None:
        now = time.monotonic()
        for instance_id in instance_ids:
            if now - self._asked.get(instance_id, 0.0) >= self.min_gap_s:
                self._pending_ids.add(instance_id)
                self._wake.set()

    def request_full(self) -> None:
        if time.monotonic() - self._last_full >= self.min_gap_s:
            self._full_wanted = True
            self._wake.set()

    async def refresh_full(self) -> None:
        self._last_full = time.monotonic()
        workers = await self.client.worker_info("all")
        self.bridge.apply_workers(workers, complete=True)
        self.refreshes += 1

    async def refresh_ids(self, instance_ids: Sequence[str]) -> None:
        now = time.monotonic()
        for instance_id in instance_ids:
            self._asked[instance_id] = now
        # "all" is served from a 30 s cache: ask by name to see fresh registrations
        answers = await asyncio.gather(*(self.client.worker_info(i) for i in instance_ids),
                                       return_exceptions=True)
        workers: list[WorkerRecord] = []
        answered: list[str] = []
        for instance_id, answer in zip(instance_ids, answers):
            if isinstance(answer, BaseException):
                continue
            workers.extend(answer)
            answered.append(instance_id)
        self.bridge.apply_workers(workers, complete=False, queried_ids=answered)
        self.refreshes += 1

    async def run(self) -> None:
        self._full_wanted = True
        while True:
            self._wake.clear()
            try:
                pending = sorted(self._pending_ids)
                self._pending_ids.clear()
                if pending:
                    await self.refresh_ids(pending)
                if self._full_wanted or time.monotonic() - self._last_full >= self.period_s:
                    self._full_wanted = False
                    await self.refresh_full()
            except Exception as exc:  # noqa: BLE001 - the controller being away only delays the bridge
                log.warning("LMCache worker-info refresh failed: %s", exc)
            self.attempts += 1
            if self._pending_ids or self._full_wanted:
                await asyncio.sleep(self.min_gap_s / 4)  # a burst of unknowns is batched, not looped on
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), self.period_s)
            except TimeoutError:
                pass
