"""loadaware/admission/wait_floor.py: rho to the slots the bands that cannot be shed leave free, read live from the
arrivals admission counts and the top band's requests in flight."""

from __future__ import annotations

import math

import pytest

from loadaware.admission.wait_floor import DecayedMean, WaitFloor, floor_of


def test_the_floor_is_rho_to_the_free_slots_and_unknown_without_slots_or_a_top_band() -> None:
    # 16 slots, the top band 2.4 in flight, 6 kept arrivals per top one: 14.4 slots busy, 1.6 free, rho 0.15
    assert floor_of(2.4, 6.0, 16.0) == pytest.approx(0.15 ** 1.6)
    assert floor_of(2.4, 7.0, 16.0) == 1.0  # they need more than the pool: every arrival waits
    assert floor_of(0.0, 6.0, 16.0) is None and floor_of(2.4, 6.0, 0.0) is None
    larger = floor_of(2.4, 6.0, 64.0)  # the same demand on four times the slots
    assert larger is not None and larger < 1e-20
    assert floor_of(2.4, 1.0, 16.0) == pytest.approx(0.15 ** 13.6)  # a top band alone


def test_a_level_is_averaged_over_the_time_since_start_then_forgets_over_tau() -> None:
    mean = DecayedMean(now=0.0, tau_s=60.0)
    mean.set(4.0, 0.0)
    assert mean.peek_mean(10.0) == pytest.approx(4.0)  # the start corrected: not 4 x (1 - e^-1/6)
    mean.set(0.0, 600.0)
    assert mean.peek_mean(660.0) == pytest.approx(4.0 * math.exp(-1.0), rel=1e-3)
    before = mean.peek_mean(700.0)
    assert mean.peek_mean(700.0) == before  # a peek changes nothing


def test_a_count_decays_over_tau() -> None:
    count = DecayedMean(now=0.0, tau_s=60.0)
    for _ in range(10):
        count.add(0.0)
    assert count.peek_sum(0.0) == pytest.approx(10.0)
    assert count.peek_sum(60.0) == pytest.approx(10.0 * math.exp(-1.0))


def test_the_live_floor_reads_the_shares_of_arrivals_and_the_top_bands_mean_in_flight() -> None:
    floor = WaitFloor(now=0.0)
    for _ in range(10):  # per 100 arrivals: 10 of the top band, 50 standard, 40 sheddable
        floor.arrived(top=True, sheddable=False, now=0.0)
    for _ in range(50):
        floor.arrived(top=False, sheddable=False, now=0.0)
    for _ in range(40):
        floor.arrived(top=False, sheddable=True, now=0.0)
    floor.top_in_flight.set(2.4, 0.0)
    reading = floor.read(slots=16.0, now=30.0)
    assert reading["kept_per_top_arrival"] == 6.0 and reading["kept_slots"] == pytest.approx(14.4)
    assert reading["floor"] == pytest.approx(0.15 ** 1.6, rel=1e-3)
    assert WaitFloor(now=0.0).read(slots=16.0, now=1.0)["floor"] is None  # no top band seen yet
