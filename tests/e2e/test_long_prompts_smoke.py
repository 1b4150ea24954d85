"""The long-prompt benchmark case in its small form (`python -m bench.long_prompts --quick`): through the real
Envoy in both modes and the real sidecar against null engines, every request is answered and every figure the
full case prints is there. Timing targets live in the benchmark (docs/results.md), not here."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import long_prompts

pytestmark = pytest.mark.e2e


def test_the_long_prompt_case_answers_every_request_and_prints_its_figures(tmp_path: Path) -> None:
    result = long_prompts.run_case(tmp_path, quick=True)
    print("\n" + long_prompts.table(result))
    assert [(c["size_kb"], c["concurrency"]) for c in result["cells"]] == [(8, 8), (32, 8)]
    for cell in result["cells"]:
        for arm in ("direct", "buffered", "full_duplex"):
            figures = cell["arms"][arm]
            assert (figures["ok"], figures["errors"]) == (24, 0), (cell["size_kb"], arm, figures)
            assert figures["ttft_p50_s"] > 0 and figures["ttft_p99_s"] >= figures["ttft_p50_s"]
        for arm in ("buffered", "full_duplex"):
            figures = cell["arms"][arm]
            assert figures["added_p99_s"] is not None and figures["sidecar_cpu_ms_per_request"] > 0
            # the prompts went through the tokenizer (the stage is timed)
            assert figures["stage_ms_per_request"]["tokenize"] > 0 and figures["stage_ms_per_request"]["parse"] > 0
    assert set(result["loop_holds"]) == {"8 KB", "32 KB"}
    assert all(0 < hold["p99_ms"] <= hold["max_ms"] for hold in result["loop_holds"].values())
    assert result["sidecar_peak_rss_mib"] > 10
