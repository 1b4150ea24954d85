"""Admit, hold or shed each request while the pool is saturated (loadaware/admission/saturation.py says when).

    room, and nobody held at its priority or above -> admitted at once
    otherwise                               -> held in its band (flow_queue.py), released when room appears:
                                               each engine scrape, each request's end, and every TICK_S
    (room for a band below the highest priority the objectives define: the free slots beyond the reserve. With
    --reserved-slots auto (the default) the reserve is over the pool, sized from the highest band's demand
    (reserve.py); with --reserved-slots N it is N per engine and as many more as the highest band has in flight)
    held past its time to live (--admission-ttl-s)
        sheddable (priority < 0)            -> 429, Retry-After, reason ttl_expired
        not sheddable                       -> held late: released after the top band into any free slot
                                               beyond the late reserve (reserve.py's looser share under auto,
                                               or --late-reserved-slots per engine), for up to LATE_S, then
                                               placed anyway (never dropped)
    the queue is full (--admission-max-held requests or --admission-max-held-bytes)
        a held sheddable request of a lower priority exists -> that one is evicted (429, reason evicted)
        else sheddable                      -> 429, reason queue_full
        else                                -> placed at once

Admissions are budgeted: the pool's room less the requests admitted and not yet decided (at once, released or
placed), so that arrivals in one instant, or one burst of room, do not all take the same free slots.
Retry-After: the requests held at or above the priority over the release rate of the last RATE_WINDOW_S
seconds, 1 to MAX_RETRY_AFTER_S.

Fail open: if anything here raises, the request is admitted.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from loadaware.admission.flow_queue import FlowQueue, Ticket, is_late
from loadaware.admission.objectives import Objectives
from loadaware.admission.reserve import LATE, LATE_TOP_WAIT_SHARE, LOWER, TOP, TOP_WAIT_SHARE, Reserve
from loadaware.admission.saturation import PoolRoom, Scraped
from loadaware.admission.state_view import admission_state
from loadaware.admission.top_holds import TopHolds
from loadaware.admission.wait_floor import WaitFloor
from loadaware.lifecycle import Decision
from loadaware.telemetry.faults import RateLimitedLog, describe

log = logging.getLogger(__name__)
faults = RateLimitedLog(log)

TICK_S = 0.05  # while anything is held: room can appear with no event (a scrape going stale, say)
# How long a request that is not sheddable waits late (any slot beyond the late reserve) past its time to live
# before it is placed anyway: within the 5 s the BUFFERED conversation adds to Envoy's message timeout for a hold
# (extproc/conversation.py, HOLD_MARGIN_S), so Envoy never gives up on it first.
LATE_S = 4.0
RATE_WINDOW_S = 10.0
MAX_RETRY_AFTER_S = 60
RELEASED, EVICTED = "released", "evicted"
MAX_FAIRNESS_IDS = 1_000  # per band, in the fairness record; more ids are counted together as "other"


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    saturation_queue: int = 0
    # Free slots per engine a lower band leaves to the highest band, besides one per request of that band in
    # flight; None (auto): a reserve over the pool sized from that band's demand (reserve.py).
    reserved_slots: int | None = None
    max_held: int = 5_000
    max_held_bytes: int = 256 * 1024 * 1024
    ttl_s: float = 30.0
    # Free slots per engine a late request leaves to the highest band (at most --reserved-slots); None (auto): the
    # pool's late reserve under auto (reserve.py), else min(1, --reserved-slots).
    late_reserved_slots: int | None = None
    late_s: float = LATE_S  # how long a request that is not sheddable is held late past its time to live
    top_wait_share: float = TOP_WAIT_SHARE  # auto: reserve.py
    late_top_wait_share: float = LATE_TOP_WAIT_SHARE


@dataclass(frozen=True, slots=True)
class Verdict:
    """What admission made of a request: admitted (with its wait) or shed (429 with a reason)."""

    admitted: bool
    priority: int
    outcome: str  # admitted | released | placed_ttl | placed_full | rejected_queue_full | rejected_ttl | evicted
    wait_s: float = 0.0
    retry_after_s: int = 0
    held: bool = False
    late: bool = False  # released from its late band: any free slot beyond the late reserve is its room


class AdmissionMetrics(Protocol):
    """What the controller reports (telemetry/metrics.py implements it)."""

    def admission(self, priority: int, outcome: str, wait_s: float) -> None: ...

    def held(self, bands: dict[int, tuple[int, int]]) -> None: ...


class Unreported:
    def admission(self, priority: int, outcome: str, wait_s: float) -> None:
        pass

    def held(self, bands: dict[int, tuple[int, int]]) -> None:
        pass


class AdmissionController:
    def __init__(self, settings: AdmissionSettings, objectives: Objectives, room: PoolRoom,
                 metrics: AdmissionMetrics | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.objectives = objectives
        self.room = room
        self.metrics: AdmissionMetrics = metrics or Unreported()
        self.clock = clock
        self.queue = FlowQueue()
        # Admitted (at once, released or placed) and not yet decided: their decisions have not taken room yet, so
        # the room they will take is set aside (arrivals in the same instant must not all see the same slot).
        self._pending = 0
        self._released_at: deque[float] = deque()  # release times within RATE_WINDOW_S (the Retry-After rate)
        self._pump_scheduled = False
        self._ticker: asyncio.TimerHandle | None = None
        self._shown_bands: set[int] = set()
        self.reserve = Reserve(settings.reserved_slots, settings.late_reserved_slots, settings.top_wait_share,
                               settings.late_top_wait_share, clock)
        self.top_holds = TopHolds()  # why the highest band waited (top_holds.py)
        self.wait_floor = WaitFloor(clock())  # what no reserve can keep it from waiting (wait_floor.py)
        # Releases made while another fairness id of the band was held too, per band and id: the service each
        # tenant got while tenants competed (their Jain index is what fairness achieved).
        self.contended: dict[int, dict[str, int]] = {}

    # ---- the request's side ----
    async def admit(self, objective: str, fairness_id: str, size: int, request_id: str = "",
                    on_hold: Callable[[float], Awaitable[None]] | None = None) -> Verdict:
        """The request's verdict; may wait (held) up to the time to live. `on_hold(seconds)` runs before a
        request is held (the BUFFERED conversation extends Envoy's message timeout there). Never raises but for
        cancellation: a failure admits."""
        priority = 0
        try:
            priority = self.objectives.priority(objective)
            self.wait_floor.arrived(priority >= self.objectives.top(), priority < 0, self.clock())
            ahead = self.queue.next_priority()  # held requests this one would have to pass
            behind = ahead is not None and ahead >= priority
            if not behind and self._has_room(priority):
                self.metrics.admission(priority, "admitted", 0.0)
                self._pending += 1
                return Verdict(True, priority, "admitted")
            hold = self.top_holds.note(self, behind) if priority >= self.objectives.top() else None
            try:
                verdict = await self._hold(priority, objective, fairness_id, size, request_id, on_hold)
            except asyncio.CancelledError:
                if hold is not None:
                    hold.waited_s, hold.outcome = self.clock() - hold.at, "left"
                raise
            if hold is not None:
                hold.waited_s, hold.outcome = verdict.wait_s, verdict.outcome
            return verdict
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - admission fails open: the request goes on
            faults.log(logging.WARNING, "admission_error", "admission_error: %s", describe(exc))
            return Verdict(True, priority, "admitted")

    @property
    def admitted_undecided(self) -> int:
        """Requests admitted (at once, released or placed) whose decision has not taken its room yet."""
        return self._pending

    def reserve_now(self) -> dict[str, int]:
        """The free slots a lower band on time and a late request leave to the highest band now, over the pool."""
        return {kind: self.reserve.per_engine(kind) * self.room.eligible_count()
                + self.reserve.beyond(kind, self.room.known_slots) for kind in (LOWER, LATE)}

    def _has_room(self, priority: int) -> bool:
        """Room for one more request of this priority, after the admitted ones not yet decided take theirs."""
        top = priority >= self.objectives.top()
        if top and not self._pending:
            return self.room.has_room()  # stops at the first engine with room
        return self._room(TOP if top else LOWER) > 0

    def _room(self, kind: str) -> float:
        """The free slots the highest band (TOP), a late request (LATE) or a band below the highest (LOWER) may
        take, less the admitted requests not yet decided: beyond what `kind` leaves to the highest band
        (reserve.py)."""
        reserve = self.reserve
        return (self.room.total(reserve.per_engine(kind)) - reserve.beyond(kind, self.room.known_slots)
                - self._pending)

    def room_for(self, verdict: Verdict) -> Callable[[str], bool]:
        """Has an engine room for one more request with this verdict: any free slot; with a reserve per engine
        (--reserved-slots N), one beyond --late-reserved-slots for a late request and one beyond --reserved-slots
        for a band below the highest.
        The decision moves a request off an engine without room when one of its candidates has some
        (routing/room.py): an admitted request placed on a full batch would wait in that engine's queue, behind
        whatever is there, however high its priority."""
        kind = TOP if verdict.priority >= self.objectives.top() else LATE if verdict.late else LOWER
        reserve = self.reserve.per_engine(kind)  # a reserve over the pool was kept when the request was let go
        of = self.room.of
        return lambda endpoint: of(endpoint) > reserve

    def settled(self, verdict: Verdict, decision: Decision | None = None) -> None:
        """A request with this verdict has been decided: an admitted one's decision now shows in the room it
        took; one of the highest band is counted in flight until it ends."""
        if verdict.admitted and self._pending > 0:
            self._pending -= 1
        if decision is not None and decision.endpoint is not None and verdict.priority >= self.objectives.top():
            self.reserve.started(id(decision))
            self._top_in_flight_changed()

    def _top_in_flight_changed(self) -> None:
        self.wait_floor.top_in_flight.set(len(self.reserve.top_inflight), self.clock())

    def top_wait_floor(self) -> float:
        """The wait floor now (wait_floor.py), NaN while unknown: the gauge's reading, from the metrics page's
        thread (pure reads; the pool's walk may meet a fleet changing under it, then it is unknown this once)."""
        try:
            floor = self.wait_floor.read(self.room.known_slots(), self.clock())["floor"]
        except RuntimeError:
            return math.nan
        return math.nan if floor is None else floor

    async def _hold(self, priority: int, objective: str, fairness_id: str, size: int, request_id: str,
                    on_hold: Callable[[float], Awaitable[None]] | None) -> Verdict:
        s = self.settings
        sheddable = priority < 0
        if len(self.queue) >= s.max_held or self.queue.size + size > s.max_held_bytes:
            victim = self.queue.lowest_sheddable(below=priority)
            if victim is not None:
                self._evict(victim)
            elif sheddable:
                return self._shed(priority, "rejected_queue_full", 0.0)
            else:
                self.metrics.admission(priority, "placed_full", 0.0)
                self._pending += 1
                return Verdict(True, priority, "placed_full")
        now = self.clock()
        ticket = Ticket(priority, fairness_id, size, now, request_id, objective,
                        asyncio.get_running_loop().create_future())
        result = await self._wait(ticket, s.ttl_s, on_hold)
        late = result is None
        if result is None:  # past its time to live
            if sheddable:
                return self._shed(priority, "rejected_ttl", self.clock() - now)
            # Held late: the pump releases it after the top band into a free slot (--late-reserved-slots). Placed
            # into a full batch instead, it would queue in the engine ahead of the top band's next requests.
            result = await self._wait(Ticket(priority, fairness_id, size, now, request_id, objective,
                                             asyncio.get_running_loop().create_future(), late=True), s.late_s)
            if result is None:
                waited = self.clock() - now
                self.metrics.admission(priority, "placed_ttl", waited)
                self._pending += 1
                return Verdict(True, priority, "placed_ttl", waited, held=True)
        waited = self.clock() - now
        if result == EVICTED:
            return self._shed(priority, "evicted", waited)
        self.metrics.admission(priority, "released", waited)
        return Verdict(True, priority, "released", waited, held=True, late=late)

    async def _wait(self, ticket: Ticket, timeout: float,
                    on_hold: Callable[[float], Awaitable[None]] | None = None) -> str | None:
        """Hold `ticket` until the pump releases or evicts it (its result), or `timeout` passes (None). In the queue
        before the first await: requests checked against the bounds while this one's hold is announced (`on_hold`)
        count it. A stream that ends while held leaves the queue."""
        self.queue.push(ticket)
        self._show_queue()
        self._schedule_pump()
        try:
            if on_hold is not None:
                await on_hold(timeout)
            result: str = await asyncio.wait_for(asyncio.shield(ticket.waiter), timeout)
            return result
        except TimeoutError:
            if ticket.waiter.done() and not ticket.waiter.cancelled():  # released in the same instant
                released: str = ticket.waiter.result()
                return released
            self.queue.discard(ticket)
            self._show_queue()
            return None
        except BaseException:  # the stream ended while held: it leaves the queue
            if self.queue.discard(ticket):
                self._show_queue()
            elif ticket.waiter.done() and not ticket.waiter.cancelled() and ticket.waiter.result() == RELEASED:
                self._pending = max(0, self._pending - 1)
            raise

    def _shed(self, priority: int, outcome: str, waited: float) -> Verdict:
        self.metrics.admission(priority, outcome, waited)
        return Verdict(False, priority, outcome, waited, self._retry_after(priority))

    def _evict(self, ticket: Ticket) -> None:
        if self.queue.discard(ticket):
            ticket.waiter.set_result(EVICTED)
            self._show_queue()

    def _retry_after(self, priority: int) -> int:
        now = self.clock()
        self._forget_releases(now)
        ahead = sum(n for p, (n, _) in self.queue.bands().items() if p >= priority) + 1
        rate = len(self._released_at) / RATE_WINDOW_S
        if rate <= 0:
            return MAX_RETRY_AFTER_S if ahead > 1 else 1
        return int(min(MAX_RETRY_AFTER_S, max(1, math.ceil(ahead / rate))))

    def _forget_releases(self, now: float) -> None:
        released = self._released_at
        while released and now - released[0] > RATE_WINDOW_S:
            released.popleft()

    # ---- room appears ----
    def on_decided(self, decision: Decision) -> None:
        """(lifecycle listener) A decision takes room through the load tracker's counts, read at the next pump."""

    def on_served(self, decision: Decision, previous: str | None) -> None:
        """(lifecycle listener) A retry moved the request: the tracker's counts moved with it."""

    def on_ended(self, decision: Decision) -> None:
        """A request ended (lifecycle listener): its engine may have room."""
        if decision is not None:
            self.reserve.ended(id(decision))
            self._top_in_flight_changed()
        if self.queue:
            self._schedule_pump()

    def on_scrape(self, endpoint: str, stats: Scraped) -> None:
        """An engine's page was scraped (load tracker listener): its batch capacity may be learned, and room
        may have appeared."""
        self.room.scraped(endpoint, stats.running, stats.waiting)
        if self.queue:
            self._schedule_pump()

    def _schedule_pump(self) -> None:
        if self._pump_scheduled:
            return
        self._pump_scheduled = True
        asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """Release held requests, highest band first, within the pool's room less those released and not yet
        decided. While anything stays held, again in TICK_S."""
        self._pump_scheduled = False
        try:
            if self.queue:
                # Each band's budget: the room beyond what it may not take, less the released not yet decided.
                top = self.objectives.top()
                budgets = {kind: self._room(kind) for kind in (TOP, LATE, LOWER)}
                now = self.clock()
                while self.queue:
                    priority = self.queue.next_priority()
                    if priority is None:
                        break
                    kind = TOP if priority >= top else LATE if is_late(priority) else LOWER
                    if budgets[kind] <= 0:
                        break
                    ticket = self.queue.pop()
                    if ticket is None:
                        break
                    if ticket.waiter.done():  # its wait ended in the same instant
                        continue
                    ticket.waiter.set_result(RELEASED)
                    if ticket.contended:
                        self._count_contended(ticket)
                    self._pending += 1
                    self._released_at.append(now)
                    for key in budgets:
                        budgets[key] -= 1
                self._forget_releases(now)
                self._show_queue()
        except Exception as exc:  # noqa: BLE001 - a failed pump: the held requests wait for the next (or their TTL)
            faults.log(logging.WARNING, "admission_error", "admission_error: %s", describe(exc))
        finally:
            if self.queue and self._ticker is None:
                self._ticker = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def _count_contended(self, ticket: Ticket) -> None:
        ids = self.contended.setdefault(ticket.priority, {})
        key = ticket.fairness_id if ticket.fairness_id in ids or len(ids) < MAX_FAIRNESS_IDS else "other"
        ids[key] = ids.get(key, 0) + 1

    def _tick(self) -> None:
        self._ticker = None
        self._pump()

    def _show_queue(self) -> None:
        bands = self.queue.bands()
        for gone in self._shown_bands - bands.keys():
            bands[gone] = (0, 0)
        self._shown_bands = {p for p, (n, _) in bands.items() if n}
        self.metrics.held(bands)

    # ---- what Explain and /debug show ----
    def preview(self, objective: str) -> dict[str, Any]:
        """What admission would make of a request naming `objective` now (changes nothing)."""
        priority = self.objectives.priority(objective)
        ahead = self.queue.next_priority()
        held_ahead = sum(n for p, (n, _) in self.queue.bands().items() if p >= priority)
        return {"priority": priority, "sheddable": priority < 0,
                "would_hold": (ahead is not None and ahead >= priority) or not self._has_room(priority),
                "held_ahead": held_ahead, "held": len(self.queue), "pool_saturation": self.room.saturation()}

    def state(self, limit: int = 100) -> dict[str, object]:
        """The /debug/state document's admission part (state_view.py)."""
        return admission_state(self, limit)
