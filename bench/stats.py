"""Small, dependency-free statistics for latency samples."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) with linear interpolation between closest ranks (numpy's
    default "linear" method). NaN for an empty sample."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside [0, 100]")
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def latency_summary_ms(latencies_s: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean in milliseconds."""
    return {
        "p50_ms": percentile(latencies_s, 50) * 1e3,
        "p90_ms": percentile(latencies_s, 90) * 1e3,
        "p99_ms": percentile(latencies_s, 99) * 1e3,
        "max_ms": (max(latencies_s) * 1e3) if latencies_s else math.nan,
        "mean_ms": mean(latencies_s) * 1e3,
    }
