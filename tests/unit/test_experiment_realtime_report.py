"""The report side of the real-time experiment: pairing, scrape rounds, the DES twin, docs/results.md."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from experiment import des
from experiment.metrics import SeedMetrics, seed_metrics
from experiment.realtime import outputs
from experiment.realtime.arms import parse_arms
from experiment.realtime.crosscheck import (
    agreement,
    des_arm,
    engine_timeline,
    prefix_servers,
    simulate_twin,
    timeline_report,
    twin_run,
)
from experiment.realtime.points import point_by_name
from experiment.realtime.sender import SenderResult
from experiment.records import EngineSample, RequestRecord, RunRecords
from experiment.results_doc import build_doc, load_des, paired_on_common_seeds, running_rounds
from experiment.workload import build
from testkit.require import require_module

require_module("matplotlib", "pip install -e '.[experiment]' (make .venv/.experiment-installed)")


def _m(arm: str, seed: int, **kw: float) -> SeedMetrics:
    base: dict[str, Any] = {f: 0.0 for f in SeedMetrics.__dataclass_fields__}
    base.update(arm=arm, seed=seed, sent=10, ok=10, errors=0, slo_s=0.15, imbalance=2.0, prefix_hit_rate=0.9,
                ttft_mean=0.2, ttft_p95=0.5, itl_p50=0.04, offered_rate=16.0, throughput_req_s=14.0)
    base.update(kw)
    return SeedMetrics(**base)


def test_pairing_keeps_only_seeds_every_arm_has() -> None:
    per_seed = {"kvaware": {1: _m("kvaware", 1), 2: _m("kvaware", 2), 3: _m("kvaware", 3)},
                "loadaware-b0.5": {3: _m("loadaware-b0.5", 3), 1: _m("loadaware-b0.5", 1)}}
    res, seeds = paired_on_common_seeds(per_seed)
    assert seeds == [1, 3]
    assert [m.seed for m in res["kvaware"]] == [1, 3] and [m.seed for m in res["loadaware-b0.5"]] == [1, 3]


def test_running_rounds_groups_concurrent_scrapes() -> None:
    samples = [EngineSample(t, e, r, 0, 0, 0, 0) for t, e, r in [
        (0.000, "engine-0", 1), (0.002, "engine-1", 2),
        (0.501, "engine-1", 3), (0.503, "engine-0", 4),  # engines answer in either order
        (1.001, "engine-0", 5),  # an incomplete last round is dropped
        (9.0, "engine-1", 6)]]  # outside the window
    run = RunRecords("kvaware", 1, [], samples, (0.0, 1.2))
    ts, per = running_rounds(run)
    assert ts == [0.0, 0.501]
    assert per == {"engine-0": [1, 4], "engine-1": [2, 3]}


def test_agreement_medians_and_relative_differences() -> None:
    real = {"kvaware": {1: _m("kvaware", 1, imbalance=2.2), 2: _m("kvaware", 2, imbalance=3.0)}}
    twin = {"kvaware": {1: _m("kvaware", 1, imbalance=2.0), 2: _m("kvaware", 2, imbalance=3.0)},
            "roundrobin": {1: _m("roundrobin", 1)}}
    a = agreement(real, twin, ("imbalance",))
    assert list(a) == ["kvaware"]  # no real rows for roundrobin: nothing to compare
    r, t, d = a["kvaware"]["imbalance"]
    assert r == pytest.approx(2.6) and t == pytest.approx(2.5) and d == pytest.approx(0.05)


def test_des_twin_credits_gpu_cache_holders_for_kv_events_arms() -> None:
    p = point_by_name("tiny")
    prepared = des.prepare(build(p.workload, 1), p.service.block_size)
    arm = parse_arms("loadaware-b0.5-kvev")[0]
    assert arm.credit == "gpu"
    sim = des.Simulation(prepared, des_arm(arm), des.FleetConfig(engines=2, service=p.service, credit="gpu"), 1)
    s = prepared.requests[0]
    assert sim._matches(s) == {}  # cold fleet: nobody holds anything
    sim.engines[0].cache.insert_blocks(s.blocks)
    sim.engines[1].cache.insert_blocks(s.blocks[:10])
    assert sim._matches(s) == {"engine-000": len(s.blocks) * 16, "engine-001": 160}  # every holder, own depth
    twin = simulate_twin(p.workload, p.service, 2, parse_arms("kvaware,loadaware-b0.5-kvev,sglang-router"), [1, 2])
    assert sorted(twin) == ["kvaware", "loadaware-b0.5-kvev"]  # peers have no twin
    assert all(m.sent == p.workload.n_requests and m.errors == 0 for rows in twin.values() for m in rows.values())


def _fake_realtime_run(root: Path, point: str = "tiny") -> Path:
    """A real-time run directory as the driver writes it, with records from the DES (no processes)."""
    p = point_by_name(point)
    out = root / "rt"
    out.mkdir()
    (out / outputs.CONFIG).write_text(json.dumps({"mode": "realtime", "point": p.describe(), "seeds": [1, 2],
                                                  "scrape_interval_s": 0.5}, default=str))
    for seed in (1, 2):
        prepared = des.prepare(build(p.workload, seed), p.service.block_size)
        for name in ("kvaware", "loadaware-b0.5", "loadaware-b0.5-kvev", "sglang-router"):
            base = des.arm_by_name("kvaware" if name == "sglang-router" else name.removesuffix("-kvev"))
            run = des.simulate(prepared, replace(base, name=name), des.FleetConfig(engines=2, service=p.service), seed)
            result = SenderResult(run.requests, run.samples, run.window, cpu_s=1.0)
            d = outputs.run_dir(out, name, seed)
            d.mkdir(parents=True)
            (d / "sender.json").write_text(result.to_json())
            info = {"arm": name, "seed": seed, "router": "peer" if name == "sglang-router" else "sidecar",
                    "wall_s": 10.0, "total_s": 12.0, "cpu_share": {"fleet": 0.1, "sender": 0.05},
                    "launch_lag_p99_ms": 1.0}
            outputs.write_run(out, name, seed, result, info)
            outputs.append_seed_metrics(out, seed_metrics(outputs.run_records(result, name, seed, 8.0)))
    return out


def test_results_doc_from_run_outputs(tmp_path: Path) -> None:
    rt = _fake_realtime_run(tmp_path)
    des_csv = tmp_path / "des" / "per_seed.csv"
    des_csv.parent.mkdir()
    for point, arm, seed in [("reference", "kvaware", 1), ("reference", "loadaware-b0.5", 1),
                             ("sweep:2x8", "loadaware-b0.5", 1), ("sweep:2x8", "kvaware", 1)]:
        outputs.append_seed_metrics_to(des_csv, _m(arm, seed), {"point": point})
    loaded = load_des(des_csv.parent)
    assert sorted(loaded) == ["reference", "sweep:2x8"] and loaded["reference"]["kvaware"][0].seed == 1
    notes = tmp_path / "notes.md"
    notes.write_text("## Findings\n\nhand-written.\n")
    args = type("A", (), {"out": tmp_path / "docs", "des": des_csv.parent, "des_single": None, "des_kvev": None,
                          "realtime": rt, "realtime_queueing": None, "notes": notes})()
    doc = build_doc(args)
    assert "### Real time, 2 seeds (1, 2), all arms and both peers" in doc
    assert "| sglang-router |" in doc and "loadaware-b0.5-kvev" in doc
    assert "real time vs its discrete-event twin" in doc
    assert doc.rstrip().endswith("[research/notebook.md](../research/notebook.md).") and "hand-written." not in doc
    for png in ("rt_reference_imbalance.png", "rt_reference_ttft_cdf.png", "rt_reference_running.png",
                "des_hit_vs_beta_2.png"):
        assert (tmp_path / "docs" / png).stat().st_size > 1000, png
    assert (rt / "des_twin.csv").exists()  # the twin is computed once and kept next to the run
    assert not math.isnan(outputs.load_per_seed(rt / "des_twin.csv")["kvaware"][1].imbalance)


def test_spearman_matches_scipy_with_ties() -> None:
    from scipy.stats import spearmanr

    from experiment.stats import spearman

    cases = [([1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]), ([1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]),
             ([1.0, 2.0, 2.0, 3.0, 5.0], [0.3, 0.1, 0.4, 0.4, 0.9]), ([2.5, 0.1, 7.0, 3.3, 3.3, 1.0],
                                                                     [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])]
    for x, y in cases:
        assert spearman(x, y) == pytest.approx(float(spearmanr(x, y).statistic), abs=1e-12)
    assert spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert math.isnan(spearman([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]))  # no order to compare


def test_engine_timeline_bins_scrapes_from_the_first_send_and_counts_prefix_servers() -> None:
    reqs = [RequestRecord(0, 10.0, "e0", prefix=0), RequestRecord(1, 10.5, "e1", prefix=0),
            RequestRecord(2, 11.0, "e0", prefix=0), RequestRecord(3, 11.5, None, prefix=1)]
    samples = [EngineSample(9.9, "e0", 50.0, 9.0, 0.1, 0, 0),  # before the first send: not in any bin
               EngineSample(10.0, "e0", 2.0, 0.0, 0.1, 0, 0), EngineSample(11.0, "e0", 4.0, 2.0, 0.1, 0, 0),
               EngineSample(11.0, "e1", 1.0, 0.0, 0.1, 0, 0), EngineSample(12.5, "e0", 6.0, 0.0, 0.1, 0, 0)]
    run = RunRecords("a", 1, reqs, samples, (10.0, 13.0))
    assert engine_timeline(run, bin_s=2.0) == {0: {"e0": (3.0, 1.0), "e1": (1.0, 0.0)}, 1: {"e0": (6.0, 0.0)}}
    assert prefix_servers(run, [0, 1, 2]) == {0: {"e0": 2, "e1": 1}, 1: {}, 2: {}}  # unknown servers skipped


def test_timeline_report_puts_a_run_beside_its_twin(tmp_path: Path) -> None:
    p = point_by_name("tiny")
    out = tmp_path / "rt"
    out.mkdir()
    (out / outputs.CONFIG).write_text(json.dumps({"point": p.describe(), "scrape_interval_s": 0.5}, default=str))
    arm = parse_arms("loadaware-b0.5-kvev")[0]
    run = twin_run(des.prepare(build(p.workload, 1), p.service.block_size), p.service, p.engines, arm, 1)
    result = SenderResult(run.requests, run.samples, run.window, cpu_s=1.0)
    (outputs.write_run(out, arm.name, 1, result, {}) / "sender.json").write_text(result.to_json())
    text = timeline_report(out, arm.name, 1, bin_s=1.0, top=2)
    real, twin = text.split("DES twin: ")
    assert real.startswith("real time: loadaware-b0.5-kvev seed 1") and "engine-000" in real
    assert real.removeprefix("real time: ").rstrip("\n") == twin  # the "real" run is the twin itself here
    assert twin.count("prefix ") == 2
    with pytest.raises(ValueError, match="peer arm"):
        timeline_report(out, "sglang-router", 1)
