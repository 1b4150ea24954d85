"""The placement probe (experiment.placement_probe): predictive's terms add up to its cost, and both probes run
on a tiny point and print what they promise."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from experiment.grid import POINTS_BY_NAME, run_grid
from experiment.placement_probe import main, probe_costs, probe_seeds
from experiment.variants import PredictiveClampedCrowd, PredictiveHeadroom, arm
from loadaware.policies.base import Candidate
from loadaware.policies.predictive import Predictive
from tests.unit.test_experiment_grid import TINY


def candidate(rng: random.Random, waiting: float = 0.0) -> Candidate:
    c = Candidate(f"10.0.0.{rng.randrange(250)}:8000", rng.randrange(0, 2000), float(rng.randrange(0, 60)))
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
