"""The report turns arm results into the summary figures the issue's targets are judged on."""

from __future__ import annotations

import math

import pytest

from bench.cases import CaseResults, StepResult
from bench.measure import ArmResult
from bench.report import case_table, steps_table, summary, summary_table


def _arm(case: str, arm: str, p50: float, p99: float, sidecar_cpu_s: float, requests: int = 1000,
         rate: float = 200) -> ArmResult:
    cpu = {"sidecar": sidecar_cpu_s, "envoy": 0.2, "fleet": 0.1, "loadgen": 0.3}
    return ArmResult(case=case, arm=arm, rate=rate, requests=requests, ok=requests, errors=0,
                     statuses={"200": requests}, achieved_rate=rate, send_lag_p99_ms=0.1,
                     latency={"p50_ms": p50, "p90_ms": p99, "p99_ms": p99, "max_ms": p99, "mean_ms": p50},
                     cpu_s=cpu, cpu_us_per_request={k: v / requests * 1e6 for k, v in cpu.items()},
                     cpu_per_wall_s={k: v / 5 for k, v in cpu.items()}, wall_s=5.0)


def test_summary_figures() -> None:
    r = CaseResults()
    r.arms += [_arm("transport", "envoy_alone", 1.0, 2.0, 0.01), _arm("transport", "envoy+sidecar", 1.5, 3.5, 0.25),
               _arm("decision", "envoy_alone", 2.0, 4.0, 0.01), _arm("decision", "envoy+sidecar", 3.0, 6.0, 1.2)]
    r.steps += [StepResult(200, True, _arm("steps", "200/s", 3, 6, 0.8, requests=1000)),
                StepResult(400, True, _arm("steps", "400/s", 3, 9, 1.0, requests=2000, rate=400)),
                StepResult(700, False, _arm("steps", "700/s", 30, 90, 2.0, requests=3500, rate=700), "p99")]
    s = summary(r)
    assert s["transport_sidecar_cpu_us"] == pytest.approx(250)
    assert s["decision_sidecar_cpu_us"] == pytest.approx(1200)
    assert s["transport_added_p99_ms"] == pytest.approx(1.5)
    assert s["decision_added_p50_ms"] == pytest.approx(1.0)
    assert s["highest_sustained_rate"] == 400
    assert s["decisions_per_core_s_at_highest"] == pytest.approx(2000)
    table = summary_table(s, 200)
    assert "250 µs" in table and "| yes |" in table
    assert "| 400 |" in steps_table(r.steps)
    assert "Envoy + sidecar" in case_table(r, "decision", "t", 1500)


def test_summary_with_nothing_measured() -> None:
    s = summary(CaseResults())
    assert s["highest_sustained_rate"] is None
    assert math.isnan(s["transport_added_p99_ms"])
    assert "n/a" in summary_table(s, 200)
    assert case_table(CaseResults(), "transport", "t", 300) == ""
