"""The peers' published policies as the simulator scores them (experiment.peers): each formula on
hand-computed candidates, and every peer arm reachable by name."""

from __future__ import annotations

from typing import Any

import pytest

from experiment.des import PEER_ARMS, arm_by_name
from experiment.peers import DynamoLinear, LlmdBlend, LlmdTokenAware, LMetric, SglangCacheAware
from experiment.tree_signals import TreeCandidate
from loadaware.policies import POLICY_NAMES


def c(ep: str, matched: int, load: float = 0.0, **kw: Any) -> TreeCandidate:
    return TreeCandidate(ep, matched, load, **kw)  # the peers' own signals: the simulator widens candidates


def test_lmetric_multiplies_prefill_work_by_decode_batch() -> None:
    # a: (100 queued + 10 uncached) x (9 + 1) = 1100; b: (0 + 1000) x (0 + 1) = 1000 -> b.
    cands = (c("a", 990, prefill_tokens=100, decode_batch=9), c("b", 0))
    choice = LMetric().choose(1000, cands)
    assert choice is not None and choice.index == 1
    assert choice.scores == (-1100.0, -1000.0)


def test_dynamo_linear_cost_in_blocks() -> None:
    # 160 tokens = 10 incoming blocks. a: max(0 + 10 - 10, 0) + 50 + 10 = 60; b: 10 + 0 + 10 = 20 -> b.
    cands = (c("a", 160, kv_blocks=50), c("b", 0))
    choice = DynamoLinear().choose(160, cands)
    assert choice is not None and choice.index == 1 and choice.scores == (-60.0, -20.0)
    # prefill_load_scale 10 makes the uncached prefill dominate: a 60, b 100 + 10 = 110 -> a.
    choice = DynamoLinear(prefill_load_scale=10).choose(160, cands)
    assert choice is not None and choice.index == 0


def test_llmd_affinity_filter_keeps_holders_until_the_in_flight_penalty() -> None:
    p = LlmdTokenAware()
    cands = (c("a", 900, uncached_tokens=50_000), c("b", 0))
    choice = p.choose(1000, cands)
    assert choice is not None and choice.index == 0  # sticky: b is filtered out however idle
    cands = (c("a", 900, uncached_tokens=300_000), c("b", 0, uncached_tokens=0))
    choice = p.choose(1000, cands)
    assert choice is not None and choice.index == 1  # over 286,720: the filter lets b in; 1000 < 300,100
    cands = (c("a", 700), c("b", 0, uncached_tokens=100))
    choice = p.choose(1000, cands)  # nobody at 0.8: token load alone, 300 < 1100
    assert choice is not None and choice.index == 0 and choice.scores == pytest.approx((-300.0, -1100.0))


def test_llmd_blend_normalises_the_queue_and_weighs_kv_usage() -> None:
    cands = (c("a", 1000, waiting=4, kv_usage=0.9), c("b", 0, waiting=0, kv_usage=0.1))
    choice = LlmdBlend().choose(1000, cands)
    assert choice is not None
    assert choice.scores == pytest.approx((3 * 1.0 + 0 + 2 * 0.1, 0 + 2 * 1.0 + 2 * 0.9))
    assert choice.index == 1


def test_sglang_cache_aware_switches_between_balance_match_and_smallest_tree() -> None:
    p = SglangCacheAware()
    balanced = (c("a", 800, load=10), c("b", 0, load=9))
    assert p.choose(1000, balanced).index == 0  # type: ignore[union-attr]  # match rate 0.8 > 0.3
    imbalanced = (c("a", 800, load=100), c("b", 0, load=20))  # 80 > 64 and 100 > 30
    assert p.choose(1000, imbalanced).index == 1  # type: ignore[union-attr]
    low_match = (c("a", 200, load=1, routed_tokens=5000), c("b", 0, load=1, routed_tokens=100))
    assert p.choose(1000, low_match).index == 1  # type: ignore[union-attr]  # 0.2 <= 0.3: smallest tree


def test_every_peer_and_sidecar_policy_is_an_arm_by_name() -> None:
    for arm in PEER_ARMS:
        assert arm_by_name(arm.name).make().name == arm.name
    for name in POLICY_NAMES:
        assert arm_by_name(name).make().name == name
    assert arm_by_name("loadaware").make().beta == 1.0  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        arm_by_name("nope")
