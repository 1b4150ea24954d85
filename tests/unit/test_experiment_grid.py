"""The placement grid (experiment.grid): its points are well formed, a tiny grid runs paired and cached,
the analysis picks the best peer per metric, and the docs section is replaced in place."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from experiment.calibration import CALIBRATED
from experiment.des import FleetConfig, arm_by_name
from experiment.des_run import Point
from experiment.grid import (
    GRID_END,
    GRID_START,
    POINTS,
    GridPoint,
    against_best_peer,
    best_peer,
    half_speed,
    report,
    run_grid,
    with_requests,
    write_doc,
)
from experiment.metrics import SeedMetrics
from experiment.workload import WorkloadSpec

TINY = GridPoint(Point("tiny", WorkloadSpec(n_prefixes=8, n_requests=30, rate=8.0, max_tokens=8),
                       FleetConfig(engines=2, service=CALIBRATED)), "tiny")


def test_eight_points_with_the_required_shapes() -> None:
    names = [p.point.name for p in POINTS]
    assert len(names) == len(set(names)) >= 8
    by = {p.point.name: p.point for p in POINTS}
    assert by["reference"].spec.rate == 16 and by["reference"].fleet.engines == 2
    assert by["bursty"].spec.arrival == "mmpp" and by["multi-turn"].spec.turns > 1
    slow = by["heterogeneous"].fleet.service_of(0)
    assert slow.prefill_tokens_per_s == CALIBRATED.prefill_tokens_per_s / 2
    assert by["heterogeneous"].fleet.service_of(1) == CALIBRATED
    assert half_speed(CALIBRATED).decode_step_seconds(10) == 2 * CALIBRATED.decode_step_seconds(10)


def test_tiny_grid_runs_paired_and_reuses_its_cached_workloads(tmp_path: Path) -> None:
    arms = [arm_by_name("predictive"), arm_by_name("lmetric")]
    first = run_grid([TINY], arms, [1, 2], jobs=1, cache=tmp_path)
    assert len(list(tmp_path.glob("tiny-*.pkl"))) == 2
    again = run_grid([TINY], arms, [1, 2], jobs=1, cache=tmp_path)
    assert first == again  # deterministic, and the cache gives back the same workloads
    res = first["tiny"]
    assert [m.seed for m in res["predictive"]] == [1, 2] and all(m.ok == 30 for m in res["lmetric"])


def _m(arm: str, seed: int, p95: float, mean: float, slo: float) -> SeedMetrics:
    values: dict[str, object] = {k: 0.0 for k in SeedMetrics.__dataclass_fields__}
    values.update(arm=arm, seed=seed, ttft_p95=p95, ttft_mean=mean, slo_miss=slo, ok=10, errors=0, sent=10)
    return SeedMetrics(**values)  # type: ignore[arg-type]


def test_best_peer_is_chosen_per_metric_and_ours_is_tested_against_it() -> None:
    res = {"ours": [_m("ours", s, 1.0 - 0.01 * s, 0.5, 0.3) for s in range(10)],
           "lmetric": [_m("lmetric", s, 2.0, 0.4, 0.5) for s in range(10)],
           "llmd-blend": [_m("llmd-blend", s, 1.5, 0.6, 0.2) for s in range(10)]}
    assert best_peer(res, "ttft_p95") == "llmd-blend" and best_peer(res, "ttft_mean") == "lmetric"
    cmp = against_best_peer(res, "ours")
    assert cmp["ttft_p95"].base == "llmd-blend" and cmp["ttft_p95"].significant()
    assert cmp["ttft_mean"].base == "lmetric" and not cmp["ttft_mean"].significant()
    assert cmp["slo_miss"].base == "llmd-blend" and not cmp["slo_miss"].significant()


def test_the_doc_section_is_replaced_in_place(tmp_path: Path) -> None:
    doc = tmp_path / "results.md"
    doc.write_text("# R\n\n## Hand-written findings\n\n- x\n")
    res = {"tiny": {"ours": [_m("ours", s, 1.0, 0.5, 0.3) for s in range(3)],
                    "lmetric": [_m("lmetric", s, 2.0, 0.4, 0.5) for s in range(3)]}}
    one = report(res, "ours", ["ours", "lmetric"], 3, "cmd", 1.0, 1)
    write_doc(doc, one)
    text = doc.read_text()
    assert text.index(GRID_START) < text.index("## Hand-written findings")
    write_doc(doc, one.replace("cmd", "cmd2"))
    text = doc.read_text()
    assert text.count(GRID_START) == 1 and text.count(GRID_END) == 1 and "cmd2" in text and "`cmd`" not in text


def test_half_speed_keeps_other_fields() -> None:
    slow = half_speed(CALIBRATED)
    assert replace(slow, prefill_tokens_per_s=CALIBRATED.prefill_tokens_per_s,
                   lmcache_load_tokens_per_s=CALIBRATED.lmcache_load_tokens_per_s,
                   decode_base_ms=CALIBRATED.decode_base_ms, decode_per_seq_ms=CALIBRATED.decode_per_seq_ms,
                   prefill_overhead_ms=CALIBRATED.prefill_overhead_ms) == CALIBRATED


def test_the_report_says_whether_its_seeds_are_held_out() -> None:
    res = {"tiny": {"ours": [_m("ours", s, 1.0, 0.5, 0.3) for s in range(3)],
                    "lmetric": [_m("lmetric", s, 2.0, 0.4, 0.5) for s in range(3)]}}
    held_out = report(res, "ours", ["ours", "lmetric"], 20, "cmd", 1.0, 1, first_seed=101)
    design = report(res, "ours", ["ours", "lmetric"], 10, "cmd", 1.0, 1, first_seed=1)
    overlapping = report(res, "ours", ["ours", "lmetric"], 5, "cmd", 1.0, 1, first_seed=8)
    assert "seeds 101-120: held out" in held_out
    assert "seeds 1-10: they overlap the design seeds" in design and "held out" not in design
    assert "not a held-out test" in overlapping


def test_a_longer_window_changes_only_the_measured_requests(tmp_path: Path) -> None:
    longer = with_requests(TINY, 45)
    assert longer.point.spec == replace(TINY.point.spec, n_requests=45)
    assert longer.point.fleet == TINY.point.fleet and TINY.point.spec.n_requests == 30
    res = run_grid([longer], [arm_by_name("lmetric")], [1], jobs=1, cache=tmp_path)["tiny"]
    assert res["lmetric"][0].ok == 45
    text = report({"tiny": {"ours": [_m("ours", s, 1.0, 0.5, 0.3) for s in range(3)],
                            "lmetric": [_m("lmetric", s, 2.0, 0.4, 0.5) for s in range(3)]}},
                  "ours", ["ours", "lmetric"], 3, "cmd", 1.0, 1, requests=2000)
    assert "2,000 measured requests per seed" in text
