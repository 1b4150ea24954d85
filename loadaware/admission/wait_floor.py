"""The wait floor: the share of the top band's arrivals that must find no free batch slot, whatever the reserve,
if the bands that cannot be shed are all to be served.

    S      = the pool's learned batch slots (saturation.py)
    top    = the top band's mean requests in flight (over FLOOR_TAU_S)
    ratio  = arrivals of the bands that cannot be shed (priority >= 0, the top band's included) per top-band
             arrival (both counted over FLOOR_TAU_S)
    D      = ratio x top           the slots those bands keep busy when all of them are served (Little's law, one
                                   time in an engine for every band: the reserve's own assumption, reserve.py)
    rho    = top / S               the top band's arrivals per end of a full pool
    floor  = rho ^ (S - D)         1 when D >= S; unknown while S or the top band's demand is

At most S - D slots can stay free on average without the band below the top going past its time to live; a
top-band arrival finds none free with probability about rho^(free slots) (reserve.py's chain). At 5% or more the
top band's p95 cannot hold without starving that band, whose late requests are then placed into full batches,
where the top band waits behind them anyway (docs/architecture.md, "What no rule can do"). An operator reads it as
`loadaware_flow_control_top_wait_floor`: above 0.05, more engines or less traffic that cannot be shed.

The mean in flight is corrected for its start (an average over the time it has run, until FLOOR_TAU_S has
passed), so the first minute reads the demand seen so far rather than a fraction of it.
"""

from __future__ import annotations

import math

FLOOR_TAU_S = 60.0  # long enough that the floor does not swing with each burst: an operator's figure
FLOOR_SHARE = 0.05  # a p95: at most 5% of the top band may wait


def floor_of(top_in_flight: float, per_top: float, slots: float) -> float | None:
    """rho^(S - D) (see the module's formula); None while the pool's slots or the top band's demand is unknown."""
    if slots <= 0 or top_in_flight <= 0 or per_top <= 0:
        return None
    free = slots - per_top * top_in_flight
    if free <= 0:
        return 1.0
    return min(1.0, (top_in_flight / slots) ** free)


class DecayedMean:
    """A quantity's time-weighted mean (a level held between changes) or a count's decayed sum, both forgetting
    over `tau_s`; `peek` reads without changing anything (the metrics page reads it from its own thread)."""

    def __init__(self, now: float, tau_s: float = FLOOR_TAU_S) -> None:
        self.tau_s = tau_s
        self._value = 0.0  # the mean (levels) or the decayed sum (counts) at `_at`
        self._level = 0.0
        self._at = self._since = now

    def set(self, level: float, now: float) -> None:
        """The level changed to `level` at `now` (the old one held until then)."""
        self._value = self._mean_at(now)
        self._level, self._at = level, max(now, self._at)

    def add(self, now: float) -> None:
        """One more of a count at `now`."""
        self._value = self._sum_at(now) + 1.0
        self._at = max(now, self._at)

    def _mean_at(self, now: float) -> float:
        return self._value + (1.0 - math.exp(-max(0.0, now - self._at) / self.tau_s)) * (self._level - self._value)

    def _sum_at(self, now: float) -> float:
        return self._value * math.exp(-max(0.0, now - self._at) / self.tau_s)

    def peek_level(self, now: float) -> float:
        """The mean level as averaged, the time before start counted as 0."""
        return self._mean_at(now)

    def peek_mean(self, now: float) -> float:
        """The mean level, as if it had been averaged only over the time since start (bias-corrected)."""
        weight = 1.0 - math.exp(-max(0.0, now - self._since) / self.tau_s)
        return self._mean_at(now) / weight if weight > 0 else self._level

    def peek_sum(self, now: float) -> float:
        return self._sum_at(now)


class WaitFloor:
    """The live wait floor: arrivals counted by admission, the top band's in flight as the reserve tracks it."""

    def __init__(self, now: float) -> None:
        self.top_arrivals = DecayedMean(now)
        self.kept_arrivals = DecayedMean(now)  # every band that cannot be shed, the top band's included
        self.top_in_flight = DecayedMean(now)

    def arrived(self, top: bool, sheddable: bool, now: float) -> None:
        if top:
            self.top_arrivals.add(now)
        if not sheddable:
            self.kept_arrivals.add(now)

    def read(self, slots: float, now: float) -> dict[str, float | None]:
        """The floor and its inputs (pure: safe from another thread, for a figure)."""
        top, kept = self.top_arrivals.peek_sum(now), self.kept_arrivals.peek_sum(now)
        per_top = kept / top if top > 0 else 0.0
        in_flight = self.top_in_flight.peek_mean(now)
        floor = floor_of(in_flight, per_top, slots)
        return {"floor": floor, "slots": slots, "top_in_flight_mean": round(in_flight, 3),
                "kept_per_top_arrival": round(per_top, 3), "kept_slots": round(per_top * in_flight, 3)}
