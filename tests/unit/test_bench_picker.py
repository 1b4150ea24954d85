"""Case 7 (picker): the figures derived from its three arms, its table, its inputs (no stack started)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.cases import FAST_FLEET, BenchConfig, CaseResults
from bench.measure import ArmResult, machine_busy_seconds
from bench.picker import ext_proc_counters, picker_fleet
from bench.report import picker_figures, picker_table, summary, summary_table
from bench.run import build_config, parse_args
from bench.workload import tiny_body


def _arm(case: str, arm: str, sidecar_cpu_s: float, msgs_sent: float | None, requests: int = 1000,
         events: int = 65, p50: float = 150.0) -> ArmResult:
    cpu = {"sidecar": sidecar_cpu_s, "envoy": 1.0, "fleet": 1.5, "loadgen": 1.2}
    counters = {} if msgs_sent is None else {"stream_msgs_sent": msgs_sent, "stream_msgs_received": msgs_sent,
                                             "streams_failed": 0.0, "failure_mode_allowed": 0.0}
    return ArmResult(case=case, arm=arm, rate=200, requests=requests, ok=requests, errors=0,
                     statuses={"200": requests}, achieved_rate=200, send_lag_p99_ms=1.0,
                     latency={"p50_ms": p50, "p90_ms": p50 + 5, "p99_ms": p50 + 10, "max_ms": p50 + 20,
                              "mean_ms": p50},
                     cpu_s=cpu, cpu_us_per_request={k: v / requests * 1e6 for k, v in cpu.items()},
                     cpu_per_wall_s={k: v / 5 for k, v in cpu.items()}, wall_s=5.0,
                     ttft={"p50_ms": 2.0, "p90_ms": 3.0, "p99_ms": 4.0, "max_ms": 5.0, "mean_ms": 2.0},
                     sse_events={str(events): requests}, counters=counters)


def _results(case: str = "picker", duplex_msgs_per_req: float = 68.0, duplex_cpu_s: float = 1.65) -> CaseResults:
    r = CaseResults()
    r.arms += [_arm(case, "envoy_alone", 0.01, None),
               _arm(case, "buffered", 0.3, 2.0 * 1000, p50=151.0),
               _arm(case, "full_duplex", duplex_cpu_s, duplex_msgs_per_req * 1000, p50=160.0)]
    return r


def test_per_chunk_divides_the_added_sidecar_cpu_by_the_events_when_every_event_crossed() -> None:
    # 68 messages per request in full duplex: headers, body, response headers, 65 response chunks.
    f = picker_figures(_results(), "picker")
    assert f is not None
    assert f["sidecar_cpu_us_added"] == pytest.approx(1350)
    assert f["response_chunks_crossed_per_request"] == pytest.approx(65)
    assert f["chunks_per_request"] == pytest.approx(65)
    assert f["sidecar_cpu_us_per_chunk"] == pytest.approx(1350 / 65)
    assert f["meets_per_chunk"] is False


def test_per_chunk_uses_the_chunks_that_crossed_when_envoy_coalesced_events() -> None:
    # Envoy read several events at once: 30 response chunks crossed for 65 events; the smaller count divides.
    f = picker_figures(_results(duplex_msgs_per_req=33.0, duplex_cpu_s=0.6), "picker")
    assert f is not None
    assert f["chunks_per_request"] == pytest.approx(30)
    assert f["sidecar_cpu_us_per_chunk"] == pytest.approx(10)
    assert f["meets_per_chunk"] is True
    # More messages than events (a body split in two, an empty last chunk): the events divide.
    g = picker_figures(_results(duplex_msgs_per_req=70.0), "picker")
    assert g is not None and g["chunks_per_request"] == pytest.approx(65)


def test_per_chunk_without_envoy_counters_falls_back_to_the_client_count_and_is_nan_without_either() -> None:
    r = _results()
    for a in r.arms:
        a.counters = {}
    f = picker_figures(r, "picker")
    assert f is not None and f["chunks_per_request"] == pytest.approx(65)
    for a in r.arms:
        a.sse_events = {}
    f = picker_figures(r, "picker")
    assert f is not None and math.isnan(f["sidecar_cpu_us_per_chunk"]) and f["meets_per_chunk"] is None
    assert picker_figures(CaseResults(), "picker") is None


def test_buffered_figure_is_held_against_the_same_runs_earlier_case() -> None:
    r = _results()
    f = picker_figures(r, "picker")
    assert f is not None and f["buffered_target_us"] == 300 and f["buffered_same_run_case"] == ""
    r.arms.append(_arm("transport", "envoy+sidecar", 0.28, 2000.0))
    f = picker_figures(r, "picker")
    assert f is not None and f["buffered_same_run_case"] == "transport"
    assert f["buffered_same_run_us"] == pytest.approx(280)


def test_picker_table_and_summary() -> None:
    r = _results()
    r.arms += _results("picker_decision", duplex_cpu_s=0.7).arms
    table = picker_table(r, "picker", "7a")
    assert "(c) + sidecar, full duplex" in table
    assert "| 150.00 | 151.00 (1.00) | 160.00 (10.00) |" in table  # p50 and what each arm adds to (a)
    assert "20.8 µs = 1,350 µs / 65.0" in table and "≤ 15 µs: NO" in table
    assert picker_table(r, "nothing", "t") == ""
    s = summary(r)
    assert s["picker_sidecar_cpu_us_per_chunk"] == pytest.approx(1350 / 65)
    assert s["picker_decision_sidecar_cpu_us_per_chunk"] == pytest.approx(400 / 65)
    assert s["picker_buffered_sidecar_cpu_us"] == pytest.approx(300)
    text = summary_table(s, 200)
    assert "full duplex (tiny prompt, leastload) | 20.8 µs | ≤ 15 µs | NO |" in text
    assert "full duplex (1,578-token decision) | 6.2 µs | ≤ 15 µs | yes |" in text
    empty = summary(CaseResults())
    assert empty["picker_sidecar_cpu_us_per_chunk"] is None and "n/a" in summary_table(empty, 200)


def test_ext_proc_counters_sum_every_listener_and_skip_the_rest() -> None:
    stats = {"http.ingress_http.ext_proc.stream_msgs_sent": 10, "http.other.ext_proc.stream_msgs_sent": 5,
             "http.ingress_http.ext_proc.streams_failed": 1, "cluster.loadaware.upstream_rq_total": 7,
             "http.ingress_http.downstream_rq_total": 3}
    assert ext_proc_counters(stats) == {"stream_msgs_sent": 15.0, "streams_failed": 1.0}
    assert ext_proc_counters({}) == {}


def test_streamed_bodies_and_the_engines_token_gap() -> None:
    assert json.loads(tiny_body(64, stream=True)) == {"model": "tiny-model", "prompt": "Hi there", "max_tokens": 64,
                                                      "stream": True, "ignore_eos": True}
    assert tiny_body() == '{"model": "tiny-model", "prompt": "Hi there", "max_tokens": 1}'  # cases 1-2 unchanged
    cfg = BenchConfig(out_dir=Path("/tmp/x"), picker_token_ms=2.5)
    args = picker_fleet(cfg)
    assert args[: len(FAST_FLEET)] == FAST_FLEET
    assert args[-4:] == ["--decode-base-ms", "2.5", "--decode-per-seq-ms", "0"]


def test_command_line_picks_the_case_and_its_options() -> None:
    cfg = build_config(parse_args(["--cases", "picker", "--picker-prompts", "tiny", "--picker-token-ms", "5"]))
    assert cfg.cases == ("picker",) and cfg.picker_prompts == ("tiny",) and cfg.picker_token_ms == 5
    assert build_config(parse_args([])).picker_prompts == ("tiny", "decision")
    with pytest.raises(SystemExit):
        build_config(parse_args(["--picker-prompts", "huge"]))


def test_machine_busy_seconds_counts_busy_ticks_of_all_cores() -> None:
    stat = ("cpu  100 5 30 900 7 2 3 11 0 0\n"
            "cpu0 50 5 15 450 3 1 1 5 0 0\n"
            "intr 123\n")
    # user + nice + system + irq + softirq; idle, iowait and steal are not busy.
    assert machine_busy_seconds(stat, 100) == pytest.approx(1.40)
    with pytest.raises(ValueError):
        machine_busy_seconds("cpu0 1 2 3 4 5 6 7\n", 100)
