"""research/admission_des.py: the product's admission controller, load tracker and room rule over simulated engines
in virtual time. Its figures mean something only if its clock is virtual, its runs repeat, every request ends, and
admission changes what the top band waits."""

from __future__ import annotations

import asyncio
import random
import time

from research.admission_des import BENCH_POINT, Point, VirtualLoop, draw_point, pct, simulate, wait_floor


def test_the_loop_jumps_to_the_next_timer_instead_of_waiting() -> None:
    loop = VirtualLoop()
    try:
        started = time.monotonic()
        loop.run_until_complete(asyncio.sleep(3600))
        assert loop.time() >= 3600 and time.monotonic() - started < 5
    finally:
        loop.close()


def test_a_run_repeats_and_every_request_is_served_or_shed() -> None:
    point = BENCH_POINT.at(1.5)
    first, again = simulate(point, 7, duration_s=10), simulate(point, 7, duration_s=10)
    assert first.delays == again.delays and first.shed == again.shed
    served = sum(len(ttfts) for ttfts in first.ttft.values())
    assert first.sent > 300 and served + sum(first.shed.values()) == first.sent
    assert first.shed["batch"] > 0 and first.shed["critical"] == first.shed["standard"] == 0


def test_admission_keeps_the_top_band_out_of_the_queues_that_saturation_builds() -> None:
    point = BENCH_POINT.at(1.5)
    on, off = simulate(point, 3, "shipped", duration_s=20), simulate(point, 3, "off", duration_s=20)
    assert pct(on.delays["critical"], 0.5) < 0.002 and pct(on.delays["critical"], 0.9) < 0.01
    assert pct(off.delays["critical"], 0.5) > 1.0  # placed at once, it waits behind everyone in the engines' queues


def test_drawn_points_stay_within_what_any_rule_could_serve() -> None:
    rng = random.Random(1)
    for _ in range(200):
        point = draw_point(rng)
        assert 2 <= point.engines <= 8 and 1.2 <= point.load <= 2.0 and 0.05 <= point.critical <= 0.2
        assert (point.critical + point.standard) * point.load <= 0.95 + 1e-9
        assert abs(sum(share for *_, share in point.mix()) - 1) < 1e-9


def test_replicas_share_the_fleet_and_answer_every_request() -> None:
    """Two sidecars, each deciding every other request and scraping the engines itself: none is lost, and each
    one's controller saw traffic (the top band's reserve is each replica's own)."""
    two = simulate(BENCH_POINT.at(1.5), 5, duration_s=10, replicas=2)
    served = sum(len(ttfts) for ttfts in two.ttft.values())
    assert served + sum(two.shed.values()) == two.sent > 300
    assert two.delays != simulate(BENCH_POINT.at(1.5), 5, duration_s=10).delays


def test_the_wait_floor_is_rho_to_the_slots_the_bands_that_cannot_be_shed_leave_free() -> None:
    # the bench's point: 16 slots, 0.6 x 1.5 of them busy on average leaves 1.6 free; rho = 0.1 x 1.5
    assert abs(wait_floor(BENCH_POINT.at(1.5)) - 0.15 ** 1.6) < 1e-12
    assert wait_floor(BENCH_POINT.at(0.7)) < 1e-9  # plenty free at 0.7x
    assert wait_floor(Point(2, 8, 2.0, 0.2, 0.4)) == 1.0  # the two need more than the pool: every arrival waits
    small, large = Point(2, 4, 1.5, 0.1, 0.5), Point(8, 32, 1.5, 0.1, 0.5)  # the same shares on 8 and 256 slots
    assert wait_floor(large) < 1e-6 < 0.05 < wait_floor(small)


def test_the_sidecars_live_wait_floor_tells_a_point_no_rule_can_serve_from_one_with_room() -> None:
    small, large = Point(3, 4, 1.61, 0.1, 0.461), Point(4, 16, 1.5, 0.1, 0.5)  # floors 12% and ~0
    live_small, live_large = simulate(small, 1, duration_s=40).live_floor, simulate(large, 1, duration_s=40).live_floor
    assert live_small is not None and live_small > 0.05 and wait_floor(small) > 0.05
    assert live_large is not None and live_large < 0.001
