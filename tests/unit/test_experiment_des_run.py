"""`python -m experiment.des_run` end to end on a tiny configuration: files, tables, tests, plots."""

from __future__ import annotations

import csv
from pathlib import Path

from experiment.des_run import main
from testkit.require import require_module

require_module("matplotlib", "pip install -e '.[experiment]' (make .venv/.experiment-installed)")


def test_des_run_writes_report_csv_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "des"
    rc = main(["--seeds", "3", "--requests", "40", "--arms", "kvaware,loadaware-b0.5,loadaware-b1.0,roundrobin",
               "--second", "engines=3,rate=24", "--sweep", "2:8", "--sweep-seeds", "2", "--jobs", "1",
               "--out", str(out)])
    assert rc == 0
    report = (out / "report.md").read_text()
    for heading in ("## Calibration against the reference", "## Reproduced table", "## Paired tests",
                    "## Second operating point: 3 engines", "## Beta sweep over utilisation: 2 engines",
                    "### Where the best beta lies", "## Runtime"):
        assert heading in report
    assert "| loadaware-b0.5 | imbalance |" in report
    rows = list(csv.DictReader((out / "per_seed.csv").open()))
    assert {r["point"] for r in rows} >= {"reference", "second:engines=3,rate=24", "sweep:2x8"}
    assert sum(r["point"] == "reference" for r in rows) == 3 * 4
    for png in ("imbalance.png", "ttft_cdf.png", "running.png", "ttft_cdf_second.png", "hit_vs_beta_2.png"):
        assert (out / png).stat().st_size > 1000
