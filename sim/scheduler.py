"""Admission control of one engine: at most `max_num_seqs` running, the rest wait in FIFO order.

`running` / `waiting` are what the engine reports as vllm:num_requests_running / _waiting. A slot is a
context manager so every exit path (normal end, client disconnect, cancellation, error) frees it; a leaked
slot would make the engine look loaded forever.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType


class Scheduler:
    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        # FIFO: a newcomer never overtakes someone already waiting.
        if self.running < self.max_num_seqs and not self._waiters:
            self.running += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # The slot was handed to us just as we were cancelled: pass it on.
                self.release()
            else:
                # A release() may already have popped (and skipped) our cancelled future.
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise

    def release(self) -> None:
        # Hand the slot straight to the next waiter so `running` never dips and a newcomer can't steal it.
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.running -= 1

    def slot(self) -> _Slot:
        return _Slot(self)


class _Slot:
    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    async def __aenter__(self) -> None:
        await self._scheduler.acquire()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._scheduler.release()
