"""Case 8 (table): its rows, the sidecar flags each row runs with, the figures and the markdown (no stack)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.cases import BenchConfig
from bench.measure import ArmResult
from bench.run import CASES, build_config, parse_args
from bench.table import TableRow, prefix_state, router_procs, without_response_headers
from bench.table_arms import APPROX, APPROX_TOK, ARMS, LMCACHE_TOK, POOL_CONFIG, arms_by_name, run_order
from bench.table_report import fastest_peer_us, row_figures, table_markdown
from testkit.paths import ENVOY_CONFIG, ENVOY_PASSTHROUGH_CONFIG


def _arm(name: str, cpu: dict[str, float], requests: int = 1000, errors: int = 0) -> ArmResult:
    return ArmResult(case="table", arm=name, rate=200, requests=requests, ok=requests - errors, errors=errors,
                     statuses={"200": requests - errors}, achieved_rate=199.5, send_lag_p99_ms=1.0,
                     latency={"p50_ms": 3.0, "p90_ms": 5.0, "p99_ms": 9.0, "max_ms": 12.0, "mean_ms": 3.5},
                     cpu_s={k: v * requests / 1e6 for k, v in cpu.items()}, cpu_us_per_request=dict(cpu),
                     cpu_per_wall_s={}, wall_s=5.0)


def _row(name: str, cpu: dict[str, float] | None, error: str = "") -> TableRow:
    arm = arms_by_name(name)[0]
    return TableRow(arm, None if cpu is None else _arm(name, cpu), error)


KEYS = ["a", "b", "c", "c2", "d", "e", "f", "g", "h", "i"]


def test_rows_are_the_issues_nine_in_order_with_their_configs() -> None:
    # ... and c2: row c without the response headers, to price them
    assert [a.key for a in ARMS] == KEYS
    by = {a.name: a for a in ARMS}
    assert by["envoy_alone"].envoy_config == ENVOY_PASSTHROUGH_CONFIG and by["envoy_alone"].sidecar is None
    assert by["buffered_approx"].envoy_config == ENVOY_CONFIG and by["buffered_approx"].mode == "BUFFERED"
    assert by["duplex_approx_tok"].envoy_config == POOL_CONFIG and by["duplex_approx_tok"].mode == "full duplex"
    assert {a.peer for a in ARMS if a.kind == "peer"} == {"sglang-router", "vllm-router"}
    assert all(a.mode == "cache_aware" for a in ARMS if a.kind == "peer")
    assert "table" in CASES


def test_arms_by_name_takes_names_or_letters_and_refuses_the_unknown() -> None:
    assert arms_by_name("all") == ARMS and arms_by_name("") == ARMS
    assert [a.key for a in arms_by_name("i,a,buffered_lmcache_tok")] == ["a", "d", "i"]  # table order
    with pytest.raises(ValueError, match="nope"):
        arms_by_name("a,nope")


def test_run_order_puts_arms_sharing_a_sidecar_back_to_back() -> None:
    order = [a.key for a in run_order(ARMS)]
    assert sorted(order) == KEYS
    assert order.index("f") == order.index("b") + 1
    assert order.index("g") == order.index("c2") + 1 == order.index("c") + 2


def test_row_c2_runs_the_shipped_config_without_response_headers(tmp_path: Path) -> None:
    (c2,) = arms_by_name("c2")
    assert not c2.response_headers and c2.envoy_config == ENVOY_CONFIG and c2.sidecar == APPROX_TOK
    derived = without_response_headers(BenchConfig(out_dir=tmp_path), ENVOY_CONFIG).read_text()
    shipped = ENVOY_CONFIG.read_text()
    assert "response_header_mode: SEND" in shipped and "response_header_mode: SEND" not in derived
    assert derived == shipped.replace("response_header_mode: SEND", "response_header_mode: SKIP")


def test_sidecar_flags_without_the_tokenizer_and_with_lmcache() -> None:
    args = APPROX.args(["127.0.0.2:8000"], "127.0.0.1:9002", "127.0.0.1:1234", None)
    assert "--tokenizer" not in args and args[args.index("--prefix-source") + 1] == "approx"
    assert args[args.index("--policy") + 1] == "auto"  # the default, as shipped
    args = LMCACHE_TOK.args(["127.0.0.2:8000"], "127.0.0.1:9002", "127.0.0.1:1234", "http://127.0.0.1:9000")
    assert "--tokenizer" in args and args[args.index("--lmcache-url") + 1] == "http://127.0.0.1:9000"
    with pytest.raises(ValueError):
        LMCACHE_TOK.args([], "127.0.0.1:9002", "127.0.0.1:1234", None)


def test_router_processes_count_lmcache_only_where_the_sidecar_asks_it() -> None:
    by = {a.name: a for a in ARMS}
    assert router_procs(by["envoy_alone"]) == ("envoy",)
    assert router_procs(by["buffered_approx_tok"]) == ("envoy", "sidecar")
    assert router_procs(by["buffered_lmcache_tok"]) == ("envoy", "sidecar", "lmcache")
    assert router_procs(by["vllm_router"]) == ("router",)


def test_figures_total_the_routing_processes_and_divide_by_the_fastest_peer() -> None:
    rows = [_row("a", {"envoy": 300, "fleet": 1500, "outside": 50}),
            _row("d", {"envoy": 600, "sidecar": 1400, "lmcache": 700, "fleet": 1500}),
            _row("h", {"router": 400, "fleet": 1500}),
            _row("i", {"router": 650, "fleet": 1500})]
    assert fastest_peer_us(rows) == pytest.approx(400)
    figs = {f["key"]: f for f in row_figures(rows)}
    assert figs["a"]["cpu_us_per_request_total"] == pytest.approx(300)
    assert figs["a"]["ratio_to_fastest_peer"] == pytest.approx(0.75)
    assert figs["d"]["cpu_us_per_request_total"] == pytest.approx(2700)
    assert figs["d"]["cpu_us_per_request"] == {"envoy": 600, "sidecar": 1400, "lmcache": 700}
    assert figs["d"]["ratio_to_fastest_peer"] == pytest.approx(6.75)
    assert figs["i"]["ratio_to_fastest_peer"] == pytest.approx(1.625)
    assert figs["a"]["other_cpu_us_per_request"] == pytest.approx(50)
    md = table_markdown(list(figs.values()), 200, 15)
    assert "| a | Envoy alone | - | 300 | 300 |" in md and "| 6.75 |" in md


def test_rows_that_did_not_run_say_why_and_no_peer_means_no_ratio() -> None:
    rows = [_row("b", {"envoy": 600, "sidecar": 1000}),
            _row("h", None, "not installed (.peers-venv/bin has no sglang-router): run `make peers`")]
    figs = row_figures(rows)
    assert math.isnan(figs[0]["ratio_to_fastest_peer"])
    assert figs[1]["error"].startswith("not installed") and "cpu_us_per_request" not in figs[1]
    md = table_markdown(figs, 200, 15)
    assert "not run: not installed" in md
    assert "| b |" in md and "| - |" in md  # the ratio cell without a peer


def test_prefix_state_sums_the_gauges_over_engines() -> None:
    text = ('loadaware_kv_index_blocks{endpoint="127.0.0.2:8000"} 100.0\n'
            'loadaware_kv_index_blocks{endpoint="127.0.0.3:8000"} 50.0\n'
            "loadaware_prefix_match_fraction 0.98\nloadaware_decisions_total 7.0\n")
    assert prefix_state(text) == {"loadaware_kv_index_blocks": 150.0, "loadaware_prefix_match_fraction": 0.98}


def test_command_line_picks_the_table_rows() -> None:
    cfg = build_config(parse_args(["--cases", "table", "--table-arms", "a,h"]))
    assert cfg.cases == ("table",) and cfg.table_arms == "a,h"
    assert build_config(parse_args([])).table_arms == "all"
    with pytest.raises(SystemExit):
        build_config(parse_args(["--table-arms", "z"]))
