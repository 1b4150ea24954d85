"""The configuration grid's smoke run: every configuration the sidecar ships, through its own pipeline."""

from __future__ import annotations

import csv
from pathlib import Path

from experiment.config_grid import CONFIGS_BY_NAME, configurations, main
from experiment.grid_blocks import PEERS


def test_every_shipped_configuration_is_a_column_of_the_grid() -> None:
    names = [c.name for c in configurations()]
    # 4 sources with a tokenizer, the approximate one and the blind exact ones without, x 2 paths x cold/warm
    assert len(names) == len(set(names)) == 24
    for source in ("lmcache", "lmcache-multi", "kv-events", "approx"):
        for path in ("seen", "buffered"):
            for warm in ("warm", "cold"):
                assert f"{source}/{path}/tok/{warm}" in CONFIGS_BY_NAME
    assert "approx/buffered/notok/cold" in CONFIGS_BY_NAME and "none/seen/notok/warm" in CONFIGS_BY_NAME
    cold = CONFIGS_BY_NAME["kv-events/seen/tok/cold"]
    from experiment.grid import POINTS_BY_NAME

    applied = cold.applied(POINTS_BY_NAME["reference"]).point
    assert applied.spec.n_requests == 500 and applied.spec.warmup_passes == 0
    assert applied.fleet.credit == "gpu" and applied.fleet.router_scrape_interval_s == 1.0


def test_the_smoke_run_fills_every_cell(tmp_path: Path) -> None:
    out = tmp_path / "grid"
    assert main(["--smoke", "--jobs", "2", "--out", str(out), "--cache", str(tmp_path / "cache"),
                 "--doc", str(tmp_path / "results.md")]) == 0
    rows = list(csv.DictReader((out / "per_seed.csv").open()))
    arms = {"lane-spread", "loadaware", *PEERS}
    assert {r["arm"] for r in rows} == arms
    assert {r["config"] for r in rows} == set(CONFIGS_BY_NAME)
    assert len(rows) == 24 * 2 * len(arms)  # one point, 2 seeds
    assert all(int(r["ok"]) == int(r["sent"]) > 0 for r in rows)  # every request answered in every cell
    report = (out / "report.md").read_text()
    assert report.count("| reference |") == 24 + 1 and (tmp_path / "config-grid-heatmap.png").stat().st_size > 10_000
    assert "config-grid:start" in (tmp_path / "results.md").read_text()
    # the same report from the run's per-seed file (how two seed ranges of one grid are merged)
    again = tmp_path / "again"
    assert main(["--from-csv", str(out / "per_seed.csv"), "--out", str(again)]) == 0
    assert (again / "report.md").read_text().count("| reference |") == 24 + 1  # the cells and the matrix header
