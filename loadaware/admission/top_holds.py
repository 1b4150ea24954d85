"""Why the highest band waited: what admission saw when one of its requests was held, for the last MAX_KEPT.

A request of the highest band is held for one of three causes, told apart at its arrival:

    behind_top   another request of its band was held already (FIFO within the band: it waits its turn)
    pending      the pool had free slots, but the requests admitted and not yet decided were about to take them
    no_room      no eligible engine had a free slot: every engine's batch full as far as the sidecar knew

Each hold keeps the pool as it was (per engine, the room formula's inputs: saturation.py) and, once the request
is released or gives up, how long it waited. /debug/state shows them (admission.top_holds): the evidence for a
top band that waits, to compare the sidecar's view of the engines with theirs. Bounded: MAX_KEPT holds of at most
MAX_ENGINES engines each; nothing is kept for a request admitted at once.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loadaware.telemetry.faults import RateLimitedLog, describe

if TYPE_CHECKING:
    from loadaware.admission.controller import AdmissionController

faults = RateLimitedLog(logging.getLogger(__name__))

BEHIND_TOP, PENDING, NO_ROOM = "behind_top", "pending", "no_room"
MAX_KEPT = 64
MAX_ENGINES = 16


@dataclass(slots=True)
class TopHold:
    at: float  # the admission clock's time of the hold
    cause: str
    pending: int  # admitted, not yet decided
    top_inflight: int  # the band's requests decided and not yet ended
    engines: list[dict[str, Any]]  # PoolRoom.view of each eligible engine (at most MAX_ENGINES)
    reserve: dict[str, int]  # the free slots a lower band on time and a late request leave to the top band
    waited_s: float | None = None  # set when the hold ends
    outcome: str = ""  # released | placed_ttl | ... (the verdict's), or "left" when its stream ended

    def as_dict(self) -> dict[str, Any]:
        return {"at": round(self.at, 4), "cause": self.cause, "pending": self.pending,
                "top_inflight": self.top_inflight, "reserve": self.reserve, "engines": self.engines,
                "waited_s": None if self.waited_s is None else round(self.waited_s, 4), "outcome": self.outcome}


@dataclass
class TopHolds:
    kept: deque[TopHold] = field(default_factory=lambda: deque(maxlen=MAX_KEPT))
    by_cause: dict[str, int] = field(default_factory=dict)  # every hold since start, by its cause

    def held(self, hold: TopHold) -> TopHold:
        self.kept.append(hold)
        self.by_cause[hold.cause] = self.by_cause.get(hold.cause, 0) + 1
        return hold

    def note(self, admission: AdmissionController, behind: bool) -> TopHold | None:
        """Keep what `admission` saw as a request of the highest band is held (`behind`: another of its band is
        held ahead). A failure here keeps nothing and the request is held all the same."""
        try:
            now = admission.clock()
            cause = cause_of(behind, not behind and admission.room.has_room())  # walks the pool only if not behind
            return self.held(TopHold(now, cause, admission.admitted_undecided, len(admission.reserve.top_inflight),
                                     admission.room.views(MAX_ENGINES, now), admission.reserve_now()))
        except Exception as exc:  # noqa: BLE001 - a diagnostic never changes the verdict
            faults.log(logging.WARNING, "admission_error", "admission_error: %s", describe(exc))
            return None

    def state(self) -> dict[str, Any]:
        return {"by_cause": dict(self.by_cause), "last": [hold.as_dict() for hold in self.kept]}


def cause_of(held_ahead: bool, pool_has_room: bool) -> str:
    """The cause of a top-band hold: another of its band ahead, else room there but promised, else none."""
    if held_ahead:
        return BEHIND_TOP
    return PENDING if pool_has_room else NO_ROOM
