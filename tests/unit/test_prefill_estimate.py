"""An engine's mean TTFT from consecutive readings of its TTFT histogram (loadaware.load.prefill_estimate)."""

from __future__ import annotations

import pytest

from loadaware.load.prefill_estimate import PRIOR_REQUESTS, TtftFromCounters


def test_the_first_interval_with_first_tokens_sets_the_mean() -> None:
    m = TtftFromCounters()
    m.scraped(10.0, 40.0)  # totals since the engine started: no interval yet
    assert m.mean_s is None
    m.scraped(10.0, 40.0)  # nothing new
    assert m.mean_s is None
    m.scraped(12.0, 44.0)  # 4 first tokens, 2 s between them
    assert m.mean_s == pytest.approx(0.5)


def test_later_intervals_weigh_by_their_first_tokens() -> None:
    m = TtftFromCounters()
    m.scraped(0.0, 0.0)
    m.scraped(4.0, 8.0)  # mean 0.5
    m.scraped(4.1, 9.0)  # one first token at 0.1 s: a small step
    few = 1 / (1 + PRIOR_REQUESTS)
    assert m.mean_s == pytest.approx(0.5 + few * (0.1 - 0.5))
    before = m.mean_s
    assert before is not None
    m.scraped(4.1 + 80 * 0.1, 89.0)  # 80 first tokens at 0.1 s: nearly replaces it
    assert m.mean_s == pytest.approx(before + 80 / (80 + PRIOR_REQUESTS) * (0.1 - before))
    assert m.mean_s is not None and abs(m.mean_s - 0.1) < 0.05


def test_a_restarted_engine_starts_over_and_missing_totals_change_nothing() -> None:
    m = TtftFromCounters()
    m.scraped(0.0, 0.0)
    m.scraped(3.0, 10.0)
    assert m.mean_s == pytest.approx(0.3)
    m.scraped(0.5, 1.0)  # counters went back: a new process; no sample from the difference
    assert m.mean_s == pytest.approx(0.3)
    m.scraped(None, None)
    m.scraped(1.5, 2.0)  # the next interval counts from the restarted totals: one first token at 1 s
    assert m.mean_s == pytest.approx(0.3 + 1 / (1 + PRIOR_REQUESTS) * (1.0 - 0.3))
