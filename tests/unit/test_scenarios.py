"""The scenario generator: draws from the documented space, design and held-out kept apart, and a smoke run of
every shipped configuration through the sidecar's own pipeline."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np

from experiment.calibration import CALIBRATED
from experiment.grid_blocks import PEERS
from experiment.scenarios import (
    CONFIGS,
    MAX_PROMPT,
    ROLES,
    Ratio,
    capacity,
    draw,
    draws,
    knows_more,
    main,
    seeds_of,
    slowed,
    verdict,
)
from experiment.workload import WorkloadSpec, arrival_times


def test_draws_are_deterministic_and_cover_the_documented_space() -> None:
    assert draw("held-out", 3) == draw("held-out", 3)
    ds = draws("held-out", 60)
    sizes = [d.point.point.fleet.engines for d in ds]
    assert min(sizes) >= 2 and max(sizes) <= 16 and len(set(sizes)) > 6
    for d in ds:
        fleet, spec = d.point.point.fleet, d.point.point.spec
        speeds = [fleet.service_of(i).prefill_tokens_per_s for i in range(fleet.engines)]
        assert max(speeds) / min(speeds) <= 3.0 + 1e-9
        assert 0.3 <= d.load <= 1.3
        assert spec.rate > 0 and 1 <= spec.n_prefixes <= 512 and 0 <= spec.zipf_s <= 1.4
        prompt = spec.prefix_tokens + spec.suffix_tokens + (spec.turns - 1) * (spec.suffix_tokens + spec.max_tokens)
        assert prompt <= MAX_PROMPT + (spec.turns - 1) * spec.max_tokens + 200  # the replies are not scaled
        assert d.warm_requests >= d.cold_requests >= 200
    assert {d.point.point.spec.arrival for d in ds} == {"poisson", "mmpp", "gamma", "ramp"}
    assert any(d.point.point.spec.turns > 1 for d in ds) and any(d.point.point.spec.max_tokens >= 256 for d in ds)
    assert any(len({d.point.point.fleet.service_of(i) for i in range(d.point.point.fleet.engines)}) > 1 for d in ds)


def test_design_and_held_out_draws_share_no_stream_and_no_seed() -> None:
    d_first, h_first = ROLES["design"][0], ROLES["held-out"][0]
    assert d_first + 999 <= h_first and not set(seeds_of("design", 9)) & set(seeds_of("held-out", 9))
    design = {d.point.description for d in draws("design", 30)}
    held = {d.point.description for d in draws("held-out", 30)}
    assert not design & held
    assert draws("design", 1)[0].name == "d001" and draws("held-out", 1)[0].name == "h001"


def test_capacity_scales_with_the_fleet_and_falls_with_slower_engines_and_longer_work() -> None:
    spec = WorkloadSpec(n_prefixes=8)  # the prefixes fit one engine's cache: the fleet adds only engines
    one = capacity(spec, [CALIBRATED])
    assert capacity(spec, [CALIBRATED] * 4) == 4 * one
    assert capacity(spec, [slowed(CALIBRATED, 2.0)]) < one
    assert capacity(replace(spec, max_tokens=512), [CALIBRATED]) < one
    assert capacity(replace(spec, n_prefixes=4096), [CALIBRATED]) < one  # the prefixes no longer fit the caches
    # the reference fleet (2 calibrated engines) sustains ~16 req/s as measured (experiment.grid, "overload")
    assert 12 < capacity(WorkloadSpec(), [CALIBRATED] * 2) < 20


def test_ramp_arrivals_speed_up_across_the_run() -> None:
    spec = WorkloadSpec(arrival="ramp", rate=10.0)
    times = arrival_times(spec, 4000, np.random.default_rng(1))
    first, last = np.diff(times[:1000]).mean(), np.diff(times[-1000:]).mean()
    assert first > 2 * last  # the rate rises 3x from the first request to the last


def test_the_verdict_applies_the_issue_s_targets() -> None:
    lead = "kv-events/seen/tok/warm"
    other = "lmcache/buffered/tok/cold"
    assert knows_more(next(c for c in CONFIGS if c.name == lead))
    assert not knows_more(next(c for c in CONFIGS if c.name == other))
    rs = [Ratio(lead, "h001", 1.0, 1.0, 0.8, "lmetric"), Ratio(other, "h001", 1.0, 1.04, 1.0, "lmetric")]
    v = verdict(rs)
    assert v.floor_met and v.lead_met and v.else_met and v.floor_within == 2
    v = verdict([*rs, Ratio(other, "h002", 1.2, 1.12, 1.3, "dynamo")])
    assert not v.floor_met and v.floor_worst.draw == "h002" and not v.else_met


def test_the_smoke_run_fills_every_configuration(tmp_path: Path) -> None:
    out = tmp_path / "scenarios"
    doc = tmp_path / "results.md"
    assert main(["--smoke", "--jobs", "2", "--out", str(out), "--cache", str(tmp_path / "cache"),
                 "--doc", str(doc)]) == 0
    rows = list(csv.DictReader((out / "per_seed.csv").open()))
    arms = {"loadaware", *PEERS}  # --policy auto is loadaware in every configuration
    assert {r["arm"] for r in rows} == arms
    assert {r["config"] for r in rows} == {c.name for c in CONFIGS} and len(CONFIGS) == 16
    assert len(rows) == 16 * 2 * len(arms)  # 2 draws, 1 seed
    assert all(int(r["ok"]) == int(r["sent"]) > 0 for r in rows)
    report = (out / "report.md").read_text()
    assert "Floor: within 5% of `loadaware` in" in report and "| h001 |" in report
    assert "scenarios:start" in doc.read_text() and (tmp_path / "scenarios.png").stat().st_size > 10_000
