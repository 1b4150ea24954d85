"""Pure parts of the benchmark: percentiles, open-loop schedules, Prometheus histogram deltas, prompts."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from bench import promtext
from bench.schedule import arrival_offsets
from bench.stats import latency_summary_ms, percentile


def test_percentile_matches_linear_interpolation() -> None:
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 5.0
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 25) == 2.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([10.0, 20.0, 30.0, 40.0], 99) == pytest.approx(39.7)
    assert percentile([7.0], 99) == 7.0
    data = [float(i * i % 97) for i in range(1000)]
    assert percentile(data, 90) == pytest.approx(statistics.quantiles(data, n=10, method="inclusive")[-1])


def test_percentile_edge_cases() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    s = latency_summary_ms([0.001, 0.002, 0.003])
    assert s["p50_ms"] == pytest.approx(2.0)
    assert s["max_ms"] == pytest.approx(3.0)


def test_fixed_schedule_is_exact() -> None:
    offs = arrival_offsets(200, 1.0, arrivals="fixed")
    assert len(offs) == 200
    assert offs[0] == 0.0
    assert offs[1] == pytest.approx(0.005)
    assert max(offs) < 1.0
    assert arrival_offsets(200, 1.0, arrivals="fixed", max_requests=10) == offs[:10]


def test_poisson_schedule_rate_count_and_determinism() -> None:
    a = arrival_offsets(1000, 20.0, seed=3)
    assert a == arrival_offsets(1000, 20.0, seed=3)
    assert a != arrival_offsets(1000, 20.0, seed=4)
    assert abs(len(a) - 20_000) < 4 * math.sqrt(20_000)  # within 4 sigma of rate * duration
    assert all(0 < x < 20.0 for x in a)
    assert a == sorted(a)
    gaps = [b - c for b, c in zip(a[1:], a[:-1])]
    assert statistics.mean(gaps) == pytest.approx(1 / 1000, rel=0.05)
    assert len(arrival_offsets(1000, 20.0, seed=3, max_requests=50)) == 50


def test_schedule_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        arrival_offsets(0, 1.0)
    with pytest.raises(ValueError):
        arrival_offsets(10, 1.0, arrivals="bursty")


BEFORE = """\
# HELP loadaware_decision_stage_seconds Wall time of each decision stage
# TYPE loadaware_decision_stage_seconds histogram
loadaware_decision_stage_seconds_bucket{le="0.001",stage="parse"} 10.0
loadaware_decision_stage_seconds_count{stage="parse"} 10.0
loadaware_decision_stage_seconds_sum{stage="parse"} 0.001
loadaware_decision_stage_seconds_count{stage="tokenize"} 4.0
loadaware_decision_stage_seconds_sum{stage="tokenize"} 0.004
loadaware_decision_seconds_count 10.0
loadaware_decision_seconds_sum 0.01
loadaware_prefix_lookups_total{result="match"} 3.0
loadaware_prefix_lookups_total{result="empty"} 1.0
"""
AFTER = """\
loadaware_decision_stage_seconds_count{stage="parse"} 110.0
loadaware_decision_stage_seconds_sum{stage="parse"} 0.003
loadaware_decision_stage_seconds_count{stage="tokenize"} 4.0
loadaware_decision_stage_seconds_sum{stage="tokenize"} 0.004
loadaware_decision_stage_seconds_count{stage="lookup"} 5.0
loadaware_decision_stage_seconds_sum{stage="lookup"} 0.005
loadaware_decision_seconds_count 60.0
loadaware_decision_seconds_sum 0.11
loadaware_prefix_lookups_total{result="match"} 13.0
loadaware_prefix_lookups_total{result="empty"} 1.0
not a metric line
"""


def test_histogram_delta_means_per_stage() -> None:
    d = promtext.histogram_delta_means(BEFORE, AFTER, "loadaware_decision_stage_seconds", by="stage")
    assert d["parse"]["count"] == 100
    assert d["parse"]["mean_s"] == pytest.approx(0.002 / 100)
    assert d["tokenize"]["count"] == 0 and math.isnan(d["tokenize"]["mean_s"])
    assert d["lookup"] == {"count": 5.0, "mean_s": pytest.approx(0.001)}  # absent before = 0
    total = promtext.histogram_delta_means(BEFORE, AFTER, "loadaware_decision_seconds")[""]
    assert total["count"] == 50 and total["mean_s"] == pytest.approx(0.002)


def test_counter_delta_and_label_parsing() -> None:
    assert promtext.counter_delta(BEFORE, AFTER, "loadaware_prefix_lookups", {"result": "match"}) == 10
    assert promtext.counter_delta(BEFORE, AFTER, "loadaware_prefix_lookups") == 10
    samples = promtext.parse_samples('m{a="x,y",b="q\\"z"} 2.5\n')
    assert samples[("m", (("a", "x,y"), ("b", 'q\\"z')))] == 2.5


def test_decision_prompts_have_exact_length_and_shared_prefixes() -> None:
    from bench.workload import PROMPT_TOKENS, PromptBuilder, decision_bodies

    b = PromptBuilder()
    warm, measured = decision_bodies(prefixes=4, per_prefix=2, builder=b)
    assert len(warm) == 4 and len(measured) == 8
    prompts = [json.loads(x)["prompt"] for x in warm + measured]
    assert {b.count(p) for p in prompts} == {PROMPT_TOKENS}
    ids = [b.tok.encode(p).ids for p in prompts]
    # warm[k] and measured[k], measured[k + 4] share at least six whole 256-token chunks.
    for k in range(4):
        assert ids[k][:1536] == ids[4 + k][:1536] == ids[8 + k][:1536]
    assert ids[0][:256] != ids[1][:256]
    assert len(set(prompts)) == len(prompts)
