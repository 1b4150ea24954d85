"""What admission shows in /debug/state: the held requests by band and the oldest of them, fairness, the learned
slots, the top band's reserve, holds and wait floor, and the settings in effect (controller.py keeps the state)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadaware.admission.controller import AdmissionController


def admission_state(c: AdmissionController, limit: int = 100) -> dict[str, object]:
    """The controller's state for /debug/state; `limit` of the held requests, oldest first."""
    now = c.clock()
    return {
        "held": len(c.queue), "held_bytes": c.queue.size, "admitted_undecided": c.admitted_undecided,
        "bands": {str(p): {"requests": n, "bytes": b} for p, (n, b) in sorted(c.queue.bands().items(),
                                                                             reverse=True)},
        "oldest": [{"request_id": t.request_id, "objective": t.objective, "priority": t.priority,
                    "fairness_id": t.fairness_id, "bytes": t.size, "waited_s": round(now - t.enqueued_at, 3)}
                   for t in c.queue.held(limit)],
        "contended_releases": {str(p): dict(ids) for p, ids in c.contended.items()},
        "jain_index": {str(p): jain_index(list(ids.values())) for p, ids in c.contended.items()},
        "slots": dict(c.room.slots), "top_inflight": len(c.reserve.top_inflight),
        "top_holds": c.top_holds.state(),
        "top_wait_floor": c.wait_floor.read(c.room.known_slots(), now),
        "top_inflight_mean": round(c.reserve.demand.mean(now), 3),
        "reserve_now": c.reserve_now(),
        "settings": {"saturation_queue": c.settings.saturation_queue,
                     "reserved_slots": _auto(c.settings.reserved_slots),
                     "late_reserved_slots": _auto(c.settings.late_reserved_slots),
                     "top_priority": c.objectives.top(), "max_held": c.settings.max_held,
                     "max_held_bytes": c.settings.max_held_bytes, "ttl_s": c.settings.ttl_s},
    }


def _auto(slots: int | None) -> int | str:
    return "auto" if slots is None else slots


def jain_index(shares: list[int]) -> float | None:
    """Jain's fairness index of the shares: (sum x)^2 / (n sum x^2), 1 when equal, 1/n when one takes all."""
    if not shares or not any(shares):
        return None
    return sum(shares) ** 2 / (len(shares) * sum(x * x for x in shares))
