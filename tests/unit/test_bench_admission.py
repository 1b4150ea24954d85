"""bench/admission.py's pure parts: the top band's waits read from the sidecar's histogram, repeats pooled."""

from __future__ import annotations

from typing import Any

import pytest

from bench.admission import own_count_bound, pooled_p95_s, ratio, table, top_holds_delta, top_waits

HISTOGRAM = "loadaware_flow_control_request_queue_duration_seconds"


def histogram(priority: str, outcome: str, waits: list[float]) -> str:
    buckets = (0.001, 0.005, 0.01, 0.05, 0.1)
    lines = [f'{HISTOGRAM}_bucket{{le="{le}",outcome="{outcome}",priority="{priority}"}} '
             f"{sum(1 for w in waits if w <= le)}.0" for le in buckets]
    lines.append(f'{HISTOGRAM}_bucket{{le="+Inf",outcome="{outcome}",priority="{priority}"}} {len(waits)}.0')
    lines.append(f'{HISTOGRAM}_count{{outcome="{outcome}",priority="{priority}"}} {len(waits)}.0')
    return "\n".join(lines) + "\n"


def test_the_top_bands_waits_are_counted_over_every_outcome_and_no_other_band() -> None:
    text = (histogram("10", "admitted", [0.0] * 20)
            + histogram("10", "released", [0.0005, 0.004, 0.02, 0.03, 0.07])
            + histogram("0", "released", [0.5] * 50))  # a lower band's long waits are not the top band's
    assert top_waits(text) == {"10/waited>1ms": 4.0, "10/waited>10ms": 3.0, "10/waited>50ms": 1.0}


def run(load: float, ttfts_ms: list[float], k: int = 0) -> dict[str, Any]:
    return {"load": load, "rate": load * 25, "requests": len(ttfts_ms), "status": {"200": len(ttfts_ms)},
            "lost": 0, "repeat": k, "critical_ttft_ms": sorted(ttfts_ms),
            "objectives": {name: {"sent": 1, "served": 1, "shed": 0, "ttft_p50_s": 0.007,
                                  "ttft_p95_s": max(ttfts_ms) / 1e3 if name == "critical" else 1.0}
                           for name in ("critical", "standard", "batch")},
            "sidecar": {"outcomes": {"10/waited>1ms": 3.0 + k},
                        "top_holds": {"by_cause": {"no_room": 2, "behind_top": k},
                                      "last": [hold(float(k), own=9), hold(k + 0.5, own=8)]}},
            "held_max": 1, "held_bytes_max": 10}


def hold(at: float, own: int, running: float = 8, cause: str = "no_room") -> dict[str, Any]:
    return {"at": at, "cause": cause, "engines": [{"endpoint": "a", "running": running, "waiting": 0.0,
                                                   "own": own, "own_since": 0, "room": 0.0}]}


def test_repeats_are_pooled_before_the_p95_and_each_ratio_is_kept() -> None:
    first, second = [float(ms) for ms in range(1, 101)], [float(ms) for ms in range(101, 201)]
    lows = [run(0.7, first), run(0.7, second, 1)]
    # the p95 of the 200 together (linear between ranks), not a mean of the two repeats' p95s (145.05 ms)
    assert pooled_p95_s(lows) == pytest.approx(0.19005)
    assert pooled_p95_s(lows[:1]) == pytest.approx(0.09505)
    highs = [run(1.5, [x * 1.2 for x in first]), run(1.5, [x * 0.6 for x in second], 1)]
    assert [ratio(a, b) for a, b in zip(lows, highs)] == pytest.approx([1.2, 0.6])  # each repeat's own p95s
    assert pooled_p95_s([]) is None


def two_repeats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"config": {"decode_ms": 20.0, "repeat": 2}, "capacity_rps": 25.0, "runs": runs,
            "figures": {"critical_ttft_p95_ratio": 1.125, "critical_ttft_p95_ratio_each": [1.125, 1.125],
                        "lost": 0, "standard_jain_index": 0.99, "held_max": 1, "held_bytes_max": 10}}


def test_the_table_shows_each_repeat_and_the_waits_of_every_repeat() -> None:
    runs = [run(0.7, [8.0] * 100), run(1.5, [9.0] * 100), run(0.7, [8.0] * 100, 1), run(1.5, [9.0] * 100, 1)]
    text = table(two_repeats(runs))
    assert "1.5x (38/s), repeat 1" in text
    assert "**1.12x** (target <= 1.2x); each repeat: 1.12x, 1.12x" in text
    assert "waited>1ms 7" in text  # 3 + 4 over the two repeats at 1.5x


def test_a_runs_top_holds_are_the_new_ones_and_its_causes_counted_since_it_began() -> None:
    before = {"by_cause": {"no_room": 3}, "last": [hold(1.0, 8), hold(2.0, 8)]}
    after = {"by_cause": {"no_room": 5, "behind_top": 1}, "last": [hold(2.0, 8), hold(3.0, 9), hold(4.0, 8)]}
    assert top_holds_delta(before, after) == {"by_cause": {"no_room": 2, "behind_top": 1},
                                              "last": [hold(3.0, 9), hold(4.0, 8)]}
    assert top_holds_delta({}, {}) == {"by_cause": {}, "last": []}
    # the room bounded by the sidecar's own count: 9 of its own in flight where the scrape showed 8
    assert own_count_bound(hold(0.0, own=9)) and not own_count_bound(hold(0.0, own=8))
    assert not own_count_bound({"engines": [{"running": None, "waiting": None, "own": 5}]})  # no fresh scrape


def test_the_table_counts_the_top_bands_holds_by_cause_at_1_5x() -> None:
    runs = [run(0.7, [8.0] * 100), run(1.5, [9.0] * 100), run(0.7, [8.0] * 100, 1), run(1.5, [9.0] * 100, 1)]
    text = table(two_repeats(runs))
    assert "by cause (loadaware/admission/top_holds.py): behind_top 1, no_room 4; of the last 4 kept, 2 with" in text
