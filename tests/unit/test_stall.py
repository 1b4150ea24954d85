"""bench/stall.py's arithmetic: the stalls' windows and what each one is summarized as."""

from __future__ import annotations

from types import SimpleNamespace

from bench.stall import SETTLE_SAMPLES, Reading, markdown, overloaded, stall_windows, summarize


def reading(t: float, rss: float) -> Reading:
    return Reading(t, rss, 10.0, 5.0, rss / 2, 3.0)


def test_the_stalls_are_spaced_by_their_length_and_the_gap() -> None:
    assert stall_windows(60, 12, 3, 90) == [(60, 72), (162, 174), (264, 276)]


def test_each_stall_reads_before_its_peak_and_the_settled_median_before_the_next() -> None:
    windows = stall_windows(10, 4, 2, 20)  # (10, 14), (34, 38)
    rss = {t: 100.0 for t in range(0, 10, 2)}
    rss.update({10: 130.0, 12: 150.0, 14: 140.0})
    rss.update({t: 110.0 for t in range(16, 34, 2)})
    rss.update({34: 160.0, 36: 150.0})
    rss.update({t: 111.0 for t in range(38, 60, 2)})
    first, second = summarize([reading(t, v) for t, v in sorted(rss.items())], windows)
    assert first["rss_mb"] == {"before": 100.0, "peak": 150.0, "settled": 110.0}
    assert second["rss_mb"] == {"before": 110.0, "peak": 160.0, "settled": 111.0}
    assert second["rest_mb"]["settled"] == 55.5 and first["inflight"]["peak"] == 3.0
    assert len(range(38, 60, 2)) >= SETTLE_SAMPLES  # the settled median saw only readings after the peak


def test_the_report_names_the_cap_and_the_requests_it_refused() -> None:
    rows = summarize([reading(t, 100.0) for t in range(0, 40, 2)], stall_windows(10, 4, 1, 20))
    cfg = {"mode": "buffered-kv", "rate": 40.0, "stall_s": 4.0, "windows": [(10, 14)]}
    assert "refused" not in markdown(rows, cfg)
    text = markdown(rows, {**cfg, "max_open_streams": 200, "overloaded": 37.0})
    assert "--max-open-streams 200: 37 requests refused with 503" in text


def test_the_refusals_are_read_from_the_decisions_counter() -> None:
    metrics = "\n".join([
        'loadaware_decisions_total{endpoint="none",outcome="overloaded",policy="auto"} 12.0',
        'loadaware_decisions_total{endpoint="none",outcome="shed",policy="auto"} 5.0',
        'loadaware_decisions_created{endpoint="none",outcome="overloaded",policy="auto"} 1.7e9'])
    run = SimpleNamespace(sidecar=SimpleNamespace(metrics_text=lambda timeout: metrics))
    assert overloaded(run) == 12.0  # type: ignore[arg-type]
