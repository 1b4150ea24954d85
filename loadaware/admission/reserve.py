"""The free batch slots the lower bands leave to the highest band (--reserved-slots auto), from its demand.

While lower bands are held, they take every slot beyond the reserve as it frees; the top band's requests take any
free slot. So the free slots rise by one at each end (until the reserve is full) and fall by one at each top-band
arrival. As a birth-death chain that is a queue of r places with ratio

    rho = top-band arrivals per end = its mean requests in flight / the pool's batch slots   (Little's law)

and a top-band arrival finds no free slot with probability about rho^r. The reserve is the smallest r that keeps
that below a share:

    reserve(rho, share) = max(1, ceil(ln(share) / ln(rho)))        rho clamped to [RHO_MIN, RHO_MAX]

    share  TOP_WAIT_SHARE (1%) for a lower band on time: it can wait (until its time to live)
           LATE_TOP_WAIT_SHARE (5%) for a request held late, past its time to live: it takes what keeps the top
           band's waits at the edge of its p95, no more, so that the band it belongs to is served rather than
           placed into full batches (where every band then queues behind it)
    rho    the top band's requests in flight: the larger of their number now and their average over DEMAND_TAU_S
           (TopDemand), over the learned batch slots of the eligible engines (saturation.py). The average alone
           lags a rise by DEMAND_TAU_S: from a cold start, or when the top band surges, the lower bands would fill
           the slots it needs meanwhile.

Why not a number of slots per engine: one slot per engine is a quarter of a 4-slot engine's batch (the standard band
starves, goes past its time to live and is placed into full batches) and too few for a top band that holds a third
of 32-slot engines; and a reserve that grows with the top band's requests in flight reserves what its requests
already hold (a fifth of the pool for a band with a fifth of the traffic) where a few slots keep its arrivals from
waiting. docs/results.md ("Admission in virtual time") has both measured over randomly drawn fleets.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from loadaware.admission.wait_floor import DecayedMean

TOP, LATE, LOWER = "top", "late", "lower"  # whose room: the highest band's, a late request's, a lower band's
TOP_WAIT_SHARE = 0.01
LATE_TOP_WAIT_SHARE = 0.05
DEMAND_TAU_S = 10.0  # the top band's in flight is averaged over about this long (a time-weighted moving average)
RHO_MIN = 1e-3
RHO_MAX = 0.95


def top_reserve(rho: float, share: float) -> int:
    """The free slots that keep a top-band arrival from finding none more than `share` of the time (see above)."""
    rho = min(max(rho, RHO_MIN), RHO_MAX)
    return max(1, math.ceil(math.log(share) / math.log(rho)))


class TopDemand(DecayedMean):
    """The top band's requests in flight, averaged over time (exponentially, over about DEMAND_TAU_S): its mean
    occupancy, which Little's law makes its arrival rate times its service time. Not corrected for its start:
    the reserve takes the larger of it and the count now (see above)."""

    def __init__(self, now: float, tau_s: float = DEMAND_TAU_S) -> None:
        super().__init__(now, tau_s)

    def mean(self, now: float) -> float:
        return self.peek_level(now)


class Reserve:
    """What each kind of request leaves free to the highest band: per engine (--reserved-slots N, and one per top-band
    request in flight for a lower band on time) or over the pool (auto: `top_reserve` of the band's demand).
    `reserved_slots` / `late_reserved_slots` None: auto (see AdmissionSettings)."""

    def __init__(self, reserved_slots: int | None, late_reserved_slots: int | None, top_wait_share: float,
                 late_top_wait_share: float, clock: Callable[[], float]) -> None:
        self.reserved_slots = reserved_slots
        self.late_reserved_slots = late_reserved_slots
        self.shares = {LOWER: top_wait_share, LATE: late_top_wait_share}
        self.clock = clock
        self.top_inflight: set[int] = set()  # the highest band's decisions in flight (ids, until they end)
        self.demand = TopDemand(clock())  # their number averaged over time (the auto reserve's demand)

    def started(self, key: int) -> None:
        """A top-band request was decided (`key`: its decision's id): in flight until `ended`."""
        if self.reserved_slots != 0:
            self.top_inflight.add(key)
            self.demand.set(len(self.top_inflight), self.clock())

    def ended(self, key: int) -> None:
        if key in self.top_inflight:
            self.top_inflight.discard(key)
            self.demand.set(len(self.top_inflight), self.clock())

    def per_engine(self, kind: str) -> int:
        """The free slots per engine that `kind` leaves to the highest band (0 where the reserve is the pool's)."""
        on_time, late = self.reserved_slots, self.late_reserved_slots
        if kind == TOP:
            return 0
        if kind == LATE:
            if late is None:
                return 0 if on_time is None else min(1, on_time)
            return late if on_time is None else min(late, on_time)
        return on_time or 0

    def beyond(self, kind: str, known_slots: Callable[[], float]) -> int:
        """The free slots that `kind` leaves to the highest band besides `per_engine`'s: over the pool under auto,
        from that band's mean requests in flight over the eligible engines' learned batch slots (`known_slots()`,
        asked only then: it walks the pool); with --reserved-slots N, a lower band on time leaves one per top-band
        request in flight."""
        if kind == TOP:
            return 0
        if self.reserved_slots is not None:
            return len(self.top_inflight) if kind == LOWER and self.reserved_slots else 0
        if kind == LATE and self.late_reserved_slots is not None:
            return 0
        slots = known_slots()
        if slots <= 0:
            return 0  # no engine has queued yet: its room is unbounded, no reserve to keep
        demand = max(self.demand.mean(self.clock()), len(self.top_inflight))
        return top_reserve(demand / slots, self.shares[kind])
