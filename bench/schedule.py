"""Open-loop arrival schedules: when each request is due, independent of when earlier ones finish."""

from __future__ import annotations

import random

ARRIVALS = ("poisson", "fixed")


def arrival_offsets(rate: float, duration: float, *, arrivals: str = "poisson", seed: int = 1,
                    max_requests: int | None = None) -> list[float]:
    """Send times in seconds from the start, all < `duration`, at most `max_requests` of them.

    `poisson`: exponential gaps with mean 1/rate (seeded, so two arms see the same arrivals).
    `fixed`: exactly one request every 1/rate seconds, starting at 0.
    """
    if rate <= 0 or duration <= 0:
        raise ValueError("rate and duration must be positive")
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {ARRIVALS}, not {arrivals!r}")
    limit = max_requests if max_requests is not None else int(rate * duration * 2) + 16
    out: list[float] = []
    if arrivals == "fixed":
        gap = 1.0 / rate
        while len(out) < limit:
            t = len(out) * gap
            if t >= duration:
                break
            out.append(t)
        return out
    rng = random.Random(seed)
    t = 0.0
    while len(out) < limit:
        t += rng.expovariate(rate)
        if t >= duration:
            break
        out.append(t)
    return out
