"""The placement probe (research.placement_probe): predictive's terms add up to its cost, and both probes run
on a tiny point and print what they promise."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from experiment.des import FleetConfig, Simulation, prepare
from experiment.grid import POINTS_BY_NAME, run_grid, with_credit
from experiment.workload import WorkloadSpec, build
from loadaware.policies.base import Candidate
from loadaware.policies.lane import Lane
from research.arms import arm_by_name as arm
from research.candidates import ResearchCandidate
from research.placement_probe import main, probe_costs, probe_seeds
from research.predictive import Predictive
from research.variants import (
    LaneDiscovered,
    LaneGreedy,
    LaneInFlight,
    LanePopular,
    LaneProduct,
    LaneRecurring,
    PredictiveClampedCrowd,
    PredictiveHeadroom,
)
from sim.service_model import ServiceModel
from tests.unit.test_experiment_grid import TINY


def candidate(rng: random.Random, waiting: float = 0.0) -> ResearchCandidate:
    c = ResearchCandidate(f"10.0.0.{rng.randrange(250)}:8000", rng.randrange(0, 2000), float(rng.randrange(0, 60)))
    c.waiting = waiting
    c.prefill_tokens = rng.randrange(0, 20_000)
    c.prefill_matched_tokens = rng.randrange(0, 20_000)
    c.decode_batch = float(rng.randrange(0, 64))
    if rng.random() < 0.7:  # a learned model; otherwise the prior stands in
        c.ttft_base_s, c.ttft_per_token_s = rng.uniform(0, 0.05), rng.uniform(1e-5, 1e-4)
        c.ttft_per_matched_token_s, c.ttft_per_running_s = rng.uniform(0, 1e-4), rng.uniform(0, 0.02)
    return c


def test_terms_add_up_to_the_cost_without_an_admission_queue() -> None:
    rng = random.Random(3)
    policy = Predictive()
    for _ in range(200):
        cands = [candidate(rng) for _ in range(4)]
        prompt = rng.randrange(1, 3000)
        assert policy.costs(prompt, cands) == [sum(policy.terms(prompt, c)) for c in cands]
        own, stall, crowd = policy.terms(prompt, cands[0])
        assert own > 0 and stall >= 0 and crowd >= 0


def test_the_clamped_variant_differs_only_in_its_crowd_price() -> None:
    rng = random.Random(4)
    variant, base = PredictiveClampedCrowd(), Predictive(crowd=0.15)
    queued = [candidate(rng, waiting=2.0) for _ in range(3)]
    assert variant.costs(1500, queued) == base.costs(1500, queued)  # the saturated formula has no crowd term
    c = candidate(rng)
    c.ttft_per_running_s, c.load, c.decode_batch = 10 * base.prior.per_running_s, 10.0, 10.0
    clamped = 2 * base.prior.per_running_s
    want = sum(base.terms(1500, c)) + 0.15 * (clamped - c.ttft_per_running_s) * 10 * 10
    assert variant.costs(1500, [c]) == pytest.approx([want])
    assert arm("predictive-crowd-clamped").name == "predictive-crowd-clamped" and arm("lmetric").name == "lmetric"


def test_headroom_is_predictive_until_an_engine_passes_half_its_cap() -> None:
    rng = random.Random(5)
    variant, base = PredictiveHeadroom(cap=64), Predictive()
    for _ in range(50):
        roomy = [candidate(rng) for _ in range(4)]
        for c in roomy:
            c.load = float(rng.randrange(0, 32))  # under half of 64
        assert variant.costs(1500, roomy) == base.costs(1500, roomy)
        queued = [candidate(rng, waiting=1.0), candidate(rng)]
        assert variant.costs(1500, queued) == base.costs(1500, queued)  # the saturated formula


def test_headroom_inflates_an_engine_fuller_than_the_fleet_mean() -> None:
    rng = random.Random(6)
    variant = PredictiveHeadroom(cap=64)
    full, half, idle = candidate(rng), candidate(rng), candidate(rng)
    full.load, half.load, idle.load = 56.0, 32.0, 4.0  # fills 0.875, 0.5 and (below the floor) 0
    mean = (0.875 + 0.5 + 0.0) / 3
    costs = variant.costs(1500, [full, half, idle])
    for c, fill, cost in zip((full, half, idle), (0.875, 0.5, 0.0), costs):
        own, stall, crowd = variant.terms(1500, c)
        assert cost == pytest.approx(own * max(1.0, (1 - mean) / (1 - fill)) + stall + crowd)
    assert costs[0] > sum(variant.terms(1500, full))  # the fullest pays for its lack of headroom
    assert costs[2] == sum(variant.terms(1500, idle))
    assert arm("predictive-headroom").make().name == "predictive-headroom"


def test_the_grid_runs_variants_in_worker_processes(tmp_path: Path) -> None:
    res = run_grid([TINY], [arm("predictive-headroom"), arm("predictive")], [1, 2], jobs=2, cache=tmp_path)["tiny"]
    assert [m.seed for m in res["predictive-headroom"]] == [1, 2] and all(m.ok == 30 for m in res["predictive"])


def test_probes_run_on_a_tiny_point(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    probe_seeds(TINY, ["predictive", "lmetric"], [1, 2], tmp_path)
    rows = [line for line in capsys.readouterr().out.splitlines() if re.match(r"\s*\d+ ", line)]
    assert [int(r.split()[0]) for r in rows] == [1, 2]
    assert all(len(re.findall(r"\d+\.\d{3} /", r)) == 2 for r in rows)  # a p95 per arm
    probe_costs(TINY, 1, 0.0, 60.0, tmp_path)
    out = capsys.readouterr().out
    decisions = re.findall(r"^t=.* -> (\S+)", out, re.M)
    assert decisions and len(re.findall(r"^ {4}\S+ matched .* total \d", out, re.M)) == 2 * len(decisions)


def test_cli_refuses_a_bad_seed_range_with_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "queueing" in POINTS_BY_NAME
    with pytest.raises(SystemExit) as exit_:
        main(["seeds", "--point", "queueing", "--seeds", "x"])
    assert exit_.value.code == 2 and "--seeds" in capsys.readouterr().err


def _bound(policy: LaneGreedy | LaneProduct, services: tuple[ServiceModel, ...]) -> Simulation:
    work = prepare(build(WorkloadSpec(n_prefixes=2, n_requests=1, warmup_passes=0), 1))
    fleet = FleetConfig(engines=len(services), service=services[0], engine_services=services)
    sim = Simulation(work, arm("lmetric"), fleet)
    policy.bind_simulation(sim)
    return sim


def test_lane_arms_price_the_predicted_ttft_at_each_engines_own_speed() -> None:
    fast = ServiceModel(prefill_tokens_per_s=4000, prefill_overhead_ms=10, decode_base_ms=8, decode_per_seq_ms=1,
                        ttft_decode_steps=2)
    slow = ServiceModel(prefill_tokens_per_s=2000, prefill_overhead_ms=20, decode_base_ms=16, decode_per_seq_ms=2,
                        ttft_decode_steps=2)
    greedy, product = LaneGreedy(), LaneProduct()
    for p in (greedy, product):
        _bound(p, (fast, slow))
    a = Candidate("engine-000", 1000, 9.0)
    b = Candidate("engine-001", 2000, 3.0)
    a.decode_batch, b.decode_batch = 8.0, 3.0
    want_a = 0.010 + 1000 / 4000 + 2 * (0.008 + 0.001 * 10)  # cold lane: own prefill + 2 steps at load + 1
    want_b = 0.020 + 0 + 2 * (0.016 + 0.002 * 4)
    assert greedy.costs(2000, [a, b]) == pytest.approx([want_a, want_b])
    assert product.costs(2000, [a, b]) == pytest.approx([want_a * 9 ** 0.75, want_b * 4 ** 0.75])  # x (decode + 1)^0.75


def test_the_lane_clock_fills_with_each_decision_and_drains_with_time() -> None:
    svc = ServiceModel(prefill_tokens_per_s=1000, prefill_overhead_ms=0, ttft_decode_steps=0)
    policy = LaneGreedy()
    sim = _bound(policy, (svc, svc))
    one, two = Candidate("engine-000", 0, 0.0), Candidate("engine-001", 0, 0.0)
    first = policy.choose(500, [one, two])
    assert first is not None and first.index == 0  # a tie goes to the lexically smaller endpoint
    assert policy.costs(500, [one, two]) == pytest.approx([1.0, 0.5])  # 0.5 s of work ahead on engine-000
    second = policy.choose(500, [one, two])
    assert second is not None and second.index == 1
    sim.now = 0.3  # time passes: both lanes drain, each had 0.5 s queued at t = 0
    assert policy.costs(500, [one, two]) == pytest.approx([0.7, 0.7])
    sim.now = 2.0  # both idle: a clock never runs below now
    assert policy.costs(500, [one, two]) == pytest.approx([0.5, 0.5])
    assert policy.choose(0, []) is None


def test_the_grid_runs_lane_arms_on_gpu_credit(tmp_path: Path) -> None:
    point = with_credit(TINY, "gpu")
    assert point.point.fleet.credit == "gpu" and TINY.point.fleet.credit == "multi"
    arms = [arm("lane-product"), arm("lane-greedy"), arm("lane")]
    res = run_grid([point], arms, [1, 2], jobs=2, cache=tmp_path)["tiny"]
    assert all(m.ok == 30 and m.errors == 0 and m.ttft_p95 > 0 for ms in res.values() for m in ms)
    assert [m.seed for m in res["lane-product"]] == [1, 2]


def test_the_in_flight_factor_replaces_lanes_decode_factor_only_while_the_gate_is_open() -> None:
    a, b = Candidate("engine-000", 1500, 6.0), Candidate("engine-001", 0, 1.0)
    a.decode_batch, b.decode_batch, a.waiting = 2.0, 1.0, 3.0
    lane, spread = Lane(), LaneInFlight()
    want = [lane.ttft(1600, c) * (c.load + 1) + lane.own_prefill_s(1600, c) * c.waiting for c in (a, b)]
    assert spread.costs(1600, [a, b]) == pytest.approx(want)
    shut = LaneRecurring(share=0.0)  # no room ever: lane exactly
    assert shut.costs(1600, [a, b]) == lane.costs(1600, [a, b])


def test_the_recurring_set_counts_blocks_seen_again_within_the_lru_and_forgets_evicted_ones() -> None:
    gate = LaneRecurring(share=0.5)
    gate.capacity_blocks = 4  # an LRU of 4 keys; room while fewer than 2 recurring blocks
    gate.observe([1, 2, 3])
    assert gate.recurring == 0 and gate.room()  # a first sight never counts: unique suffixes stay out
    gate.observe([1, 2])
    assert gate.recurring == 2 and not gate.room()
    gate.observe([1])
    assert gate.recurring == 2  # a third sight counts once
    gate.observe([7, 8, 9])  # 4 keys fit: 8 pushes out 3 (seen once), 9 pushes out 2 (recurring)
    assert gate.recurring == 1 and gate.room()
    gate.observe([6])  # and 1
    assert gate.recurring == 0
    sampled = LaneRecurring(share=0.5, sample=4)
    sampled.capacity_blocks = 64
    sampled.observe(list(range(16)) * 2)
    assert sampled.recurring == 4  # keys 0, 4, 8, 12 are sampled, each counted for 4


def test_popularity_is_the_count_where_the_longest_match_ends() -> None:
    gate = LanePopular(share=1e9, min_count=1)
    gate.capacity_blocks = 100
    keys = [10, 11, 12, 13]
    gate.observe(keys[:2])
    gate._keys = keys
    held = Candidate("engine-000", 2 * 16, 0.0)  # holds the first two blocks
    cold = Candidate("engine-001", 0, 0.0)
    assert not gate.popular([held, cold])  # key 11 routed once; 2 engines need 2
    gate.observe(keys[:2])
    assert gate.popular([held, cold])
    assert not gate.popular([cold, Candidate("engine-002", 0, 0.0)])  # no match anywhere: nothing to spread
    assert LanePopular(min_count=8).min_count == 8


def test_the_gated_arm_runs_on_the_grid(tmp_path: Path) -> None:
    point = with_credit(TINY, "gpu")
    res = run_grid([point], [arm("lane-cap2-popular"), arm("lane-inflight")], [1], jobs=1, cache=tmp_path)["tiny"]
    assert all(m.ok == 30 and m.errors == 0 for ms in res.values() for m in ms)
    sim = Simulation(prepare(build(point.point.spec, 1)), arm("lane-cap2-popular"), point.point.fleet, 1)
    policy = sim.policy
    assert isinstance(policy, LanePopular) and policy.window == 2.0 and policy.min_count == 1
    assert policy.capacity_blocks == sum(e.svc.kv_capacity_blocks for e in sim.engines)
    sim.run()
    assert len(policy._counts) > 0  # the wrapped decision hook fed it every routed prompt


def test_the_discovered_gate_stays_shut_while_a_prompt_head_has_been_seen_once() -> None:
    gate = LaneDiscovered()
    gate.capacity_blocks = 100
    assert gate.room()  # nothing seen: no singleton, no recurring block
    gate.observe([1, 2])
    assert gate.singletons == 1 and not gate.room()  # prompt head 1 seen once: the working set may still grow
    gate.observe([1, 3])
    assert gate.singletons == 0 and gate.room()
    gate.observe([5, 6])
    gate.observe([1, 2])
    assert gate.singletons == 1 and not gate.room()  # head 5 once; head 1 a third time changes nothing
    gate.observe([5])
    assert gate.room()
