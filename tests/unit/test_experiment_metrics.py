"""Per-seed metrics as the reference defines them, checked on synthetic runs and on reference rows."""

from __future__ import annotations

import math

import pytest

from experiment import reference
from experiment.metrics import (
    arm_valid,
    from_reference_row,
    imbalance,
    kv_spread,
    median_of,
    prefix_hit_rate,
    seed_metrics,
    slo_miss_share,
)
from experiment.records import EngineSample, RequestRecord, RunRecords
from testkit.require import requires


def sample(t: float, engine: str, running: float, kv: float = 0.5, q: float = 0.0, h: float = 0.0,
           waiting: float = 0.0) -> EngineSample:
    return EngineSample(t, engine, running, waiting, kv, q, h)


def test_imbalance_is_busiest_over_idlest_mean_running_inside_the_window() -> None:
    samples = [sample(t, "a", 41) for t in range(1, 11)] + [sample(t, "b", 17) for t in range(1, 11)]
    samples += [sample(50, "a", 1000)]  # outside the window: ignored
    assert imbalance(samples, (1, 10)) == pytest.approx(41 / 17)
    assert imbalance([sample(1, "a", 0), sample(1, "b", 0)], (0, 2)) == 1.0  # idle fleet
    assert math.isinf(imbalance([sample(1, "a", 3), sample(1, "b", 0)], (0, 2)))


def test_kv_spread_uses_kv_usage() -> None:
    s = [sample(1, "a", 1, kv=0.8), sample(2, "a", 1, kv=0.6), sample(1, "b", 1, kv=0.35)]
    assert kv_spread(s, (0, 3)) == pytest.approx(0.7 / 0.35)


def test_hit_rate_is_sum_of_hit_deltas_over_sum_of_query_deltas() -> None:
    s = [sample(0, "a", 0, q=1000, h=900), sample(5, "a", 0, q=11000, h=9900),
         sample(0, "b", 0, q=0, h=0), sample(5, "b", 0, q=2000, h=1000)]
    assert prefix_hit_rate(s, (0, 5)) == pytest.approx((9000 + 1000) / (10000 + 2000))


def rec(i: int, ttft: float | None, ok: bool = True, itl: tuple[float, ...] = (0.04,) * 63) -> RequestRecord:
    send = float(i)
    first = None if ttft is None else send + ttft
    end = None if first is None else first + sum(itl)
    return RequestRecord(i, send, "a", first, end if ok else send + 1, list(itl), ok,
                         None if ok else "HTTP 500", 1578, 64 if ok else 0)


def test_slo_miss_counts_errors_and_late_first_tokens_over_sent() -> None:
    rs = [rec(0, 0.1), rec(1, 0.2), rec(2, 0.149), rec(3, 0.05, ok=False)]
    assert slo_miss_share(rs, 0.150) == pytest.approx(2 / 4)
    assert slo_miss_share(rs, 0.250) == pytest.approx(1 / 4)


def test_seed_metrics_percentiles_throughput_and_validity() -> None:
    rs = [rec(i, 0.1 + 0.001 * i) for i in range(100)]
    rs[7] = rec(7, None, ok=False)
    samples = [sample(t, e, r) for t in range(0, 105) for e, r in (("a", 30), ("b", 15))]
    run = RunRecords("kvaware", 1, rs, samples, window=(0.0, 104.0), offered_rate=1.0)
    m = seed_metrics(run)
    assert m.sent == 100 and m.ok == 99 and m.errors == 1 and m.error_rate == pytest.approx(0.01)
    assert m.itl_p50 == pytest.approx(0.04) and m.imbalance == pytest.approx(2.0)
    assert m.running_busiest == 30 and m.running_idlest == 15
    last_end = 99 + 0.199 + 63 * 0.04
    assert m.throughput_req_s == pytest.approx(99 / last_end)
    assert m.throughput_tok_s == pytest.approx(99 * 64 / last_end)
    assert m.ttft_p50 == pytest.approx(0.1495, abs=1e-3)
    assert m.valid and arm_valid([m])
    bad = RunRecords("x", 2, [rec(i, 0.1, ok=i >= 11) for i in range(100)], samples, (0.0, 104.0))
    assert not seed_metrics(bad).valid and not arm_valid([m, seed_metrics(bad)])


@requires("reference data", reference.available(), "experiment/reference_data is checked in: restore it")
def test_reference_rows_reproduce_the_published_table_and_gates() -> None:
    summary = reference.load_summary()
    per_seed = reference.load_per_seed()
    for cell, published in reference.TABLE.items():
        rows = [from_reference_row(cell, s, summary[cell][s], per_seed[cell][s]["ttft_slo_miss_150ms"])
                for s in range(1, 21)]
        assert median_of(rows, "imbalance") == pytest.approx(published.imbalance, abs=0.001)
        assert median_of(rows, "slo_miss") == pytest.approx(published.slo_miss, abs=0.001)
        if cell != "roundrobin":  # published as "11.0 (saturated)"
            assert median_of(rows, "ttft_p95") == pytest.approx(published.ttft_p95, abs=0.001)
        assert arm_valid(rows)  # no reference seed crossed the 10% error gate
        for r in rows:  # the summary's own columns are internally consistent with our definitions
            assert r.error_rate == pytest.approx(r.errors / 500, abs=1e-3)
            assert r.throughput_tok_s == pytest.approx(64 * r.throughput_req_s, rel=2e-3)
    kv = [from_reference_row("kvaware", s, summary["kvaware"][s]) for s in range(1, 21)]
    assert median_of(kv, "ttft_mean") == pytest.approx(0.185, abs=0.001)  # "kvaware TTFT mean ~0.19 s"
    assert median_of(kv, "itl_p50") == pytest.approx(0.0417, abs=0.001)  # "ITL median ~42 ms"
    rr = [from_reference_row("roundrobin", s, summary["roundrobin"][s]) for s in range(1, 21)]
    assert median_of(rr, "throughput_req_s") / 16 == pytest.approx(0.65, abs=0.01)  # "65% of offered"
