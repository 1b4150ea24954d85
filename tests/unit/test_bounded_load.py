"""The pile-up guard (loadaware/policies/bounded.py): no signal can pile a fleet onto one engine."""

from __future__ import annotations

import math
import random

import pytest

from loadaware.policies import Candidate
from loadaware.policies.bounded import MAX_SHARE, PRICED_OUT, bounded_costs, within_bound
from loadaware.policies.lane_spread import LaneSpread


def test_an_endpoint_holding_half_the_fleets_load_takes_no_more() -> None:
    # loads 10, 5, 3 (18, and this request: 19): cap = ceil(0.5 x 19) = 10 -> 10 + 1 > 10 is out
    c = [Candidate("a", 0, 10), Candidate("b", 0, 5), Candidate("c", 0, 3)]
    assert within_bound(c) == [False, True, True]
    assert within_bound(c, share=0.6) == [True, True, True]  # cap ceil(11.4) = 12
    assert within_bound(c, share=1.0) == [True, True, True]  # off
    assert within_bound(c[:2]) == [True, True]  # two endpoints: not bounded (half is an even split)


def test_an_idle_fleet_takes_its_first_requests_anywhere() -> None:
    idle = [Candidate(str(i), 0, 0) for i in range(4)]
    assert within_bound(idle) == [True] * 4  # cap ceil(0.5) = 1
    assert within_bound([]) == []


def test_the_least_loaded_is_always_eligible() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        n = rng.randint(1, 12)
        c = [Candidate(str(i), 0, float(rng.randint(0, 80))) for i in range(n)]
        ok = within_bound(c, share=rng.choice([0.3, 0.5, 0.8]))
        assert ok[min(range(n), key=lambda i: c[i].load)]


def test_priced_out_candidates_rank_after_every_eligible_one_in_their_own_order() -> None:
    c = [Candidate("a", 0, 10), Candidate("b", 0, 5), Candidate("c", 0, 3)]
    out = bounded_costs([0.1, 0.5, 0.4], c)
    assert out[1:] == [0.5, 0.4] and out[0] == pytest.approx(0.1 + PRICED_OUT)
    assert bounded_costs([0.1, 0.5, 0.4], c, share=1.0) == [0.1, 0.5, 0.4]


def test_a_hot_prefix_on_its_credited_holder_cannot_pile_up() -> None:
    """The stock-LMCache failure: one engine credited with the whole prompt (the first registered holder), the
    others with nothing, the TTFT model at its prior. Unguarded, lane-spread keeps choosing the holder as its
    batch grows; guarded, the holder stops at half of the fleet's requests."""
    def route(policy: LaneSpread, n: int) -> list[int]:
        loads = [0, 0, 0]
        for _ in range(n):
            c = [Candidate(f"e{i}", 1500 if i == 0 else 0, float(loads[i]), decode_batch=float(loads[i]))
                 for i in range(3)]
            choice = policy.choose(1578, c)
            assert choice is not None
            loads[choice.index] += 1
        return loads

    unguarded = route(LaneSpread(max_share=1.0), 60)
    assert unguarded[0] > 30  # more than half of the fleet's requests on one engine
    guarded = route(LaneSpread(), 60)
    assert guarded[0] <= math.ceil(MAX_SHARE * 60) and min(guarded) > 0
