"""The KV-events benchmark's own machinery (a quick run: it must credit every holder and finish)."""

from __future__ import annotations

from bench import kv_events


def test_quick_run_credits_every_holder_and_reports_targets() -> None:
    result = kv_events.run(quick=True)
    decision, ingest = result["decision"], result["ingest"]
    assert decision["prompt_tokens"] == 1578 and decision["engines"] == 64
    assert decision["holders_credited_per_prompt"] == 4.0  # every one of the 4 holders of each prefix
    assert decision["decision_cpu_us"] > 0 and ingest["block_events_per_s"] > 0
    assert ingest["indexed_blocks_after"] == 65 * 16  # the churn keeps 65 live runs of 16 blocks
    assert "KV-events decision path" in kv_events.table(result)
