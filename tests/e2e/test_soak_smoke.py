"""The mixed soak (`python -m bench.soak`) in its smallest form: both configurations side by side (envoy.yaml
BUFFERED with KV events, the endpoint picker with the approximate source) for half a minute, with a burst and an
engine leaving and coming back. Every request is answered (2xx, or 429 with Retry-After), nothing is left in
flight, and the report has every bound's row, the samples and both growth figures. Whether the bounds fill and
memory stays flat is the long run's question, not this one's."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak_mixed import MODES, MixedConfig, run_mixed
from bench.soak_report import markdown

pytestmark = pytest.mark.e2e


def test_a_short_mixed_soak_answers_every_request_and_reports_every_bound(tmp_path: Path) -> None:
    cfg = MixedConfig(out_dir=tmp_path, duration_s=30, rate=10, sample_s=10, churn_every_s=8, churn_out_s=6,
                      burst_every_s=15, burst_s=5, admission_ttl_s=2)
    report = run_mixed(cfg)
    print("\n" + markdown(report))
    assert list(report["modes"]) == list(MODES)
    for mode, r in report["modes"].items():
        assert r["failed"] == 0, (mode, r["traffic"]["failures"][:5])
        assert r["after"]["inflight_total"] == 0 and r["after"]["open_streams"] == 0, (mode, r["after"])
        assert r["traffic"]["cancels"] > 0 and sum(n for k, n in r["traffic"]["outcomes"].items()
                                                   if k.endswith(":ok")) > 100
        names = {b["name"] for b in r["bounds"]}
        assert {"session_map", "state_holders", "conversation_cache_bytes", "decisions_ring", "admission_held",
                "approx_index", "metric_series"} <= names
        assert ("kv_events_index" in names) == (mode == "buffered-kv")
        assert [c["action"] for c in r["churn"]][:2] == ["leave", "back"]
        assert len(r["samples"]) >= 3 and r["rss_growth"] is not None
