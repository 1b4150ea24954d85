"""The held requests: one band per priority, highest released first; within a band, round robin across fairness
ids, first come first served within one id.

Why round robin across ids (llm-d's "round-robin" fairness, one of its plugins): while two tenants are both
backlogged in a band each gets every other release whatever their arrival rates, so a batch tenant sending ten
times as much cannot queue in front of another's requests; it needs no weights, no clock and no per-tenant
history, and no id can starve (an id waits at most one turn per other backlogged id). Within one id the order
is arrival (FCFS).

Bounded by the controller (requests and bytes); removal of a request that left (its time to live passed, its
stream ended) is O(1): it is marked and its counts drop at once, and the rotation skips it when reached.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False, slots=True)
class Ticket:
    """One held request."""

    priority: int
    fairness_id: str
    size: int  # bytes: what holding it costs (its body)
    enqueued_at: float
    request_id: str = ""
    objective: str = ""
    waiter: Any = None  # the controller's future for it
    gone: bool = False  # removed (released, expired, evicted or cancelled)
    contended: bool = False  # when released: another fairness id of its band was held too (fairness applied)
    # Past its time to live and not sheddable (controller.py): held in its band's late band, just above it, which
    # may take any free slot beyond the late reserve (controller.py).
    late: bool = False

    @property
    def band(self) -> float:
        return self.priority + LATE if self.late else self.priority


LATE = 0.5  # a late band's key above its own priority: released before it, after every higher band


def is_late(band: float) -> bool:
    return band != int(band)


@dataclass(slots=True)
class Band:
    """The held requests of one priority: a FIFO per fairness id, the ids in rotation order."""

    flows: OrderedDict[str, deque[Ticket]] = field(default_factory=OrderedDict)
    count: int = 0
    size: int = 0
    stale: int = 0  # removed requests still in a FIFO (skipped when reached; compacted past a bound)
    live: dict[str, int] = field(default_factory=dict)  # fairness id -> its held requests

    def compact(self) -> None:
        """Drop the removed requests from every FIFO (and the ids left with none), so that expiries during a long
        saturation cannot grow the band past its live requests."""
        for fairness_id in list(self.flows):
            live = deque(t for t in self.flows[fairness_id] if not t.gone)
            if live:
                self.flows[fairness_id] = live
            else:
                del self.flows[fairness_id]
        self.stale = 0


class FlowQueue:
    def __init__(self) -> None:
        self._bands: dict[float, Band] = {}
        self._order: list[float] = []  # bands' keys (priorities, late bands between), highest first
        self.count = 0
        self.size = 0

    def __len__(self) -> int:
        return self.count

    def push(self, ticket: Ticket) -> None:
        band = self._bands.get(ticket.band)
        if band is None:
            band = self._bands[ticket.band] = Band()
            self._order = sorted(self._bands, reverse=True)
        flow = band.flows.get(ticket.fairness_id)
        if flow is None:
            flow = band.flows[ticket.fairness_id] = deque()
        flow.append(ticket)
        band.live[ticket.fairness_id] = band.live.get(ticket.fairness_id, 0) + 1
        band.count += 1
        band.size += ticket.size
        self.count += 1
        self.size += ticket.size

    def pop(self) -> Ticket | None:
        """The next request to release: the highest band's next fairness id in rotation, its oldest request."""
        for priority in self._order:
            band = self._bands[priority]
            while band.count > 0:
                fairness_id, flow = next(iter(band.flows.items()))
                while flow and flow[0].gone:
                    flow.popleft()
                    band.stale -= 1
                if not flow:
                    del band.flows[fairness_id]
                    continue
                ticket = flow.popleft()
                ticket.contended = band.count > band.live.get(fairness_id, 0)
                if flow:
                    band.flows.move_to_end(fairness_id)  # its turn is taken: the next id goes first
                else:
                    del band.flows[fairness_id]
                self._removed(ticket, band)
                return ticket
        return None

    def next_priority(self) -> float | None:
        """The band the next `pop` releases from (None: nothing held): its priority, or a late band's key."""
        for priority in self._order:
            if self._bands[priority].count > 0:
                return priority
        return None

    def discard(self, ticket: Ticket) -> bool:
        """Take a held request out (its time to live passed, it was evicted or its stream ended). False: it had
        already left."""
        if ticket.gone:
            return False
        band = self._bands.get(ticket.band)
        if band is None:
            return False
        self._removed(ticket, band)
        if ticket.band in self._bands:
            band.stale += 1
            if band.stale > band.count + 64:
                band.compact()
        return True

    def lowest_sheddable(self, below: int) -> Ticket | None:
        """The newest held request of the lowest band that is sheddable (priority < 0) and below `below`: the one
        to evict for a more important arrival when the queue is full."""
        for priority in reversed(self._order):
            if priority >= 0 or priority >= below:
                return None
            band = self._bands[priority]
            for flow in reversed(band.flows.values()):
                for ticket in reversed(flow):
                    if not ticket.gone:
                        return ticket
        return None

    def bands(self) -> dict[int, tuple[int, int]]:
        """{priority: (held requests, held bytes)} for every band that holds any, a late band counted in its own."""
        out: dict[int, tuple[int, int]] = {}
        for key, b in self._bands.items():
            if b.count:
                n, size = out.get(math.floor(key), (0, 0))
                out[math.floor(key)] = (n + b.count, size + b.size)
        return out

    def held(self, limit: int) -> list[Ticket]:
        """Up to `limit` held requests, highest band first (for /debug)."""
        out: list[Ticket] = []
        for priority in self._order:
            for flow in self._bands[priority].flows.values():
                for ticket in flow:
                    if not ticket.gone:
                        out.append(ticket)
                        if len(out) >= limit:
                            return out
        return out

    def _removed(self, ticket: Ticket, band: Band) -> None:
        ticket.gone = True
        left = band.live.get(ticket.fairness_id, 0) - 1
        if left > 0:
            band.live[ticket.fairness_id] = left
        else:
            band.live.pop(ticket.fairness_id, None)
        band.count -= 1
        band.size -= ticket.size
        self.count -= 1
        self.size -= ticket.size
        if band.count == 0:  # an empty band goes: priorities are few, but a band's flows must not linger
            del self._bands[ticket.band]
            self._order = sorted(self._bands, reverse=True)
