"""An open-loop sender that keeps every request's outcome: one request every 1/rate seconds whatever the
answers do (a failing engine must not slow the offered load down), for tests and demos that break the fleet
under steady traffic and then look at what clients got in a time window."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class Sent:
    at: float  # monotonic send time
    status: int = 0  # 0: no HTTP answer (a transport failure)
    latency: float = 0.0
    served_by: str = ""


# Sends request n and returns (HTTP status, the engine that served it).
SendOne = Callable[[int], Awaitable[tuple[int, str]]]


@dataclass
class OpenLoopSender:
    rate: float  # requests per second
    send_one: SendOne
    sent: list[Sent] = field(default_factory=list)

    async def run(self, stop: asyncio.Event, drain_s: float = 30.0) -> None:
        """Send until `stop` is set, then wait up to `drain_s` for the requests still open."""
        tasks: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        n = 0
        while not stop.is_set():
            n += 1
            record = Sent(time.monotonic())
            self.sent.append(record)
            task = asyncio.create_task(self._one(record, n))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(max(0.0, start + n / self.rate - time.monotonic()))
        if tasks:
            await asyncio.wait(tasks, timeout=drain_s)

    async def _one(self, record: Sent, n: int) -> None:
        try:
            record.status, record.served_by = await self.send_one(n)
        except Exception:  # noqa: BLE001 - a transport failure is a failed request, status 0
            record.status = 0
        record.latency = time.monotonic() - record.at

    def window(self, start: float, end: float) -> list[Sent]:
        """The requests sent in [start, end)."""
        return [s for s in self.sent if start <= s.at < end]


def success_rate(sent: list[Sent]) -> float:
    return sum(1 for s in sent if s.status == 200) / max(1, len(sent))
