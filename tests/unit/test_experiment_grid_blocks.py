"""experiment.grid_blocks: a long grid run judged in 20-seed blocks, each against its own best peer, from
the per_seed.csv the grid writes."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from experiment.grid import report, write_per_seed
from experiment.grid_blocks import block_summary, block_table, main, read_per_seed
from experiment.metrics import SeedMetrics


def _seed(arm: str, seed: int, p95: float) -> SeedMetrics:
    values: dict[str, object] = {f.name: 0.0 for f in fields(SeedMetrics)}
    values.update(arm=arm, seed=seed, ttft_p95=p95, ttft_mean=p95 / 2, slo_miss=0.1, sent=10, ok=10, errors=0)
    return SeedMetrics(**values)  # type: ignore[arg-type]


def _run(ours: list[float], peers: dict[str, list[float]]) -> dict[str, list[SeedMetrics]]:
    res = {"lane": [_seed("lane", s, v) for s, v in enumerate(ours)]}
    res.update({p: [_seed(p, s, v) for s, v in enumerate(vs)] for p, vs in peers.items()})
    return res


def test_each_block_is_judged_alone_against_its_own_best_peer() -> None:
    # Block 1: ours 1.0 against lmetric 2.0 (won every seed). Block 2: ours 1.0 against llmd-blend 0.9 there,
    # though lmetric stays the better peer by median over all 40 seeds and ours beats it on every seed.
    ours = [1.0 + 0.001 * s for s in range(40)]
    lmetric = [2.0 + 0.001 * s for s in range(20)] + [1.5 + 0.001 * s for s in range(20)]
    blend = [3.0] * 20 + [0.9 + 0.001 * s for s in range(20)]
    s = block_summary("p", _run(ours, {"lmetric": lmetric, "llmd-blend": blend}), "lane", 20)
    assert s.peer == "lmetric" and s.won == 40
    assert (s.passed, s.blocks, s.seeds) == (1, 2, 40)


def test_seeds_past_the_last_whole_block_count_only_as_wins() -> None:
    ours = [1.0] * 45
    s = block_summary("p", _run(ours, {"lmetric": [2.0 + 0.01 * i for i in range(45)]}), "lane", 20)
    assert (s.won, s.passed, s.blocks) == (45, 2, 2)
    with pytest.raises(ValueError):
        block_summary("p", _run(ours, {"lmetric": [2.0] * 45}), "lane", 0)


def test_a_coin_toss_passes_no_block() -> None:
    ours = [1.0 + (0.1 if s % 2 else -0.1) for s in range(40)]
    s = block_summary("p", _run(ours, {"lmetric": [1.0] * 40}), "lane", 20)
    assert (s.won, s.passed) == (20, 0)


def test_the_grid_csv_reads_back_paired_and_the_cli_prints_the_table(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    results = {"reference": _run([1.0] * 40, {"lmetric": [2.0 + 0.01 * i for i in range(40)]}),
               "overload": _run([2.0] * 40, {"lmetric": [1.0] * 40})}
    path = tmp_path / "per_seed.csv"
    write_per_seed(path, results)
    back = read_per_seed(path)
    assert back == results
    assert main([str(path), "--ours", "lane"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == block_table(results, "lane", 20)
    assert "| reference | lmetric | 40 of 40 | 2 of 2 |" in out and "| overload | lmetric | 0 of 40 | 0 of 2 |" in out
    with pytest.raises(SystemExit):
        main([str(path), "--ours", "nobody"])


def test_unpaired_seeds_are_refused(tmp_path: Path) -> None:
    results = {"p": _run([1.0] * 3, {"lmetric": [2.0] * 3})}
    results["p"]["lmetric"][2] = _seed("lmetric", 7, 2.0)
    path = tmp_path / "per_seed.csv"
    write_per_seed(path, results)
    with pytest.raises(ValueError, match="not paired"):
        read_per_seed(path)


def test_a_long_grid_report_carries_the_block_table_and_a_short_one_does_not() -> None:
    long = {"reference": _run([1.0] * 40, {"lmetric": [2.0 + 0.01 * i for i in range(40)]})}
    text = report(long, "lane", ["lane", "lmetric"], 40, "cmd", 1.0, 1)
    assert "cut into 2 blocks of 20 seeds" in text and "| reference | lmetric | 40 of 40 | 2 of 2 |" in text
    short = {"reference": _run([1.0] * 20, {"lmetric": [2.0] * 20})}
    assert "blocks of 20 seeds" not in report(short, "lane", ["lane", "lmetric"], 20, "cmd", 1.0, 1)
