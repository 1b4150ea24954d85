"""The soak's pure parts: its Envoy config on private ports, its RSS growth figure, its bodies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench.soak import (
    UNIQUE_MARKER,
    Sample,
    growth,
    malloc_in_use_mb,
    mapping_mb,
    private_envoy_config,
    read_malloc,
    rss_mb,
    soak_bodies,
)


def test_private_config_keeps_the_shipped_one_but_its_ports_and_engines(tmp_path: Path) -> None:
    fleet = ["127.0.77.2:41000", "127.0.77.3:41000", "127.0.77.4:41000"]
    out = private_envoy_config(fleet, listen=42001, admin=42002, sidecar=42003, out=tmp_path / "envoy.yaml")
    config = yaml.safe_load(out.read_text())
    assert config["admin"]["address"]["socket_address"]["port_value"] == 42002
    assert config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] == 42001
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    engines = [e["endpoint"]["address"]["socket_address"]
               for e in clusters["engines"]["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert [f"{e['address']}:{e['port_value']}" for e in engines] == fleet
    sidecar = clusters["loadaware_sidecar"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert sidecar["endpoint"]["address"]["socket_address"]["port_value"] == 42003
    assert "port_value: 10000" not in out.read_text() and "port_value: 9901" not in out.read_text()


def test_private_config_of_a_smaller_fleet_leaves_the_shipped_engines_it_lacks_out(tmp_path: Path) -> None:
    fleet = ["127.0.79.2:41000", "127.0.79.3:41000"]
    out = private_envoy_config(fleet, listen=42001, admin=42002, sidecar=42003, out=tmp_path / "envoy.yaml")
    clusters = {c["name"]: c for c in yaml.safe_load(out.read_text())["static_resources"]["clusters"]}
    engines = [e["endpoint"]["address"]["socket_address"]
               for e in clusters["engines"]["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert [f"{e['address']}:{e['port_value']}" for e in engines] == fleet
    assert "127.0.0." not in out.read_text().replace("127.0.0.1", "")
    with pytest.raises(ValueError):
        private_envoy_config([*fleet, "127.0.79.4:41000", "127.0.79.5:41000"], 1, 2, 3, tmp_path / "four.yaml")


def test_growth_is_between_the_samples_nearest_the_window() -> None:
    samples = [Sample(t, rss, 0.0) for t, rss in ((0, 70.0), (290, 100.0), (310, 101.0), (1790, 104.0), (1800, 105.0))]
    (t0, t1), start, end, pct = growth(samples, 300, 1800)
    assert (t0, t1, start, end) == (290, 1800, 100.0, 105.0) and pct == pytest.approx(5.0)
    with pytest.raises(ValueError):
        growth([], 0, 1)


def test_rss_of_this_process_and_its_mappings() -> None:
    import os

    rss = rss_mb(os.getpid())
    heap, anon = mapping_mb(os.getpid())
    assert 5 < rss < 10_000 and 0 < heap + anon <= rss


THREAD_ARENA_PROBE = """
import json, os, sys, threading
from bench.soak import anon_parts
from loadaware.collector import cap_malloc_arenas

assert cap_malloc_arenas(int(sys.argv[1])) == (int(sys.argv[1]) > 0)

allocated, release = threading.Event(), threading.Event()

def allocate():  # a new thread's malloc calls get an arena of their own (glibc)
    held = [bytearray(2000) for _ in range(16_000)]  # ~32 MiB, each under malloc's mmap threshold
    allocated.set()
    release.wait(10)
    del held

before = anon_parts(os.getpid())
thread = threading.Thread(target=allocate)
thread.start()
assert allocated.wait(10)
during = anon_parts(os.getpid())
release.set()
thread.join()
print(json.dumps([before, during]))
"""


def run_thread_arena_probe(arena_max: int) -> tuple[list[float], list[float]]:
    # A fresh process: in pytest's, a finished test's thread may leave an arena whose pages are still resident,
    # and the new thread would reuse it without adding a resident page.
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", THREAD_ARENA_PROBE, str(arena_max)], capture_output=True, text=True,
                         timeout=60, check=True, cwd=str(Path(__file__).resolve().parents[2])).stdout
    before, during = json.loads(out)
    return before, during


def test_the_anonymous_pages_a_thread_allocates_are_told_as_its_glibc_arena() -> None:
    before, (arenas, stacks, other) = run_thread_arena_probe(0)  # glibc's default: the thread gets its own arena
    assert arenas - before[0] > 24, (before, (arenas, stacks, other))  # most of the 32 MiB, told as the arena's
    assert other - before[2] < 8 and stacks >= 0


def test_with_one_arena_allowed_a_thread_allocates_from_the_main_heap() -> None:
    # The sidecar's --malloc-arena-max, at its strictest: no thread arena is made, the 32 MiB land in [heap].
    before, (arenas, _stacks, _other) = run_thread_arena_probe(1)
    assert arenas - before[0] < 2, (before, arenas)


def test_bodies_share_prefixes_and_carry_the_marker() -> None:
    bodies = [json.loads(b) for b in soak_bodies(prefixes=2, per_prefix=2, max_tokens=3)]
    assert len(bodies) == 4 and all(UNIQUE_MARKER in b["prompt"] and b["max_tokens"] == 3 for b in bodies)
    heads = [b["prompt"].split(UNIQUE_MARKER)[0] for b in bodies]
    assert heads[0] == heads[2] and heads[1] == heads[3] and heads[0] != heads[1]


def test_the_live_malloc_figure_is_read_from_the_sidecars_metrics() -> None:
    text = ("# TYPE loadaware_malloc_in_use_bytes gauge\nloadaware_malloc_in_use_bytes 3.145728e+07\n"
            "loadaware_malloc_free_bytes 1048576.0\n")
    assert malloc_in_use_mb(text) == 30.0
    assert malloc_in_use_mb("loadaware_malloc_free_bytes 1.0\n") == 0.0  # before the first collection


def test_a_sample_reads_live_malloc_its_mmapped_part_and_pythons_blocks() -> None:
    text = ("loadaware_malloc_in_use_bytes 3.145728e+07\nloadaware_malloc_mmapped_bytes 2097152.0\n"
            "loadaware_malloc_mmapped_bytes_created 1.0\nloadaware_python_allocated_blocks 123456.0\n")
    sample = Sample(t_s=1.0, rss_mb=90.0, cpu_s=1.0)
    read_malloc(sample, text)
    assert (sample.malloc_in_use_mb, sample.malloc_mmapped_mb, sample.python_blocks) == (30.0, 2.0, 123456.0)
    older = Sample(t_s=1.0, rss_mb=90.0, cpu_s=1.0)
    read_malloc(older, "loadaware_malloc_in_use_bytes 1048576.0\n")  # a sidecar without the two parts
    assert (older.malloc_in_use_mb, older.malloc_mmapped_mb, older.python_blocks) == (1.0, 0.0, 0.0)


def test_soak_flags_reach_its_config() -> None:
    from bench.run import build_config, parse_args, soak_config

    args = parse_args(["--cases", "soak", "--soak-rate", "60", "--soak-prefix-sources", "approx"])
    soak = soak_config(args, build_config(args))
    assert (soak.rate, soak.prefix_sources) == (60.0, "approx")
    default = parse_args(["--cases", "soak"])
    assert soak_config(default, build_config(default)).prefix_sources == "kv-events,approx"


# ---------------------------------------------------------------------------------------------------------
# the mixed soak (python -m bench.soak): its schedule, bounds, judgement and configs
# ---------------------------------------------------------------------------------------------------------

def test_the_cli_reads_hours_or_minutes_and_a_mode() -> None:
    from bench.soak import parse_args

    args = parse_args(["--hours", "2"])
    assert (args.hours, args.minutes, args.mode, args.rate) == (2.0, None, "both", 40.0)
    assert parse_args(["--minutes", "6", "--mode", "picker-approx"]).mode == "picker-approx"
    with pytest.raises(SystemExit):
        parse_args(["--hours", "1", "--minutes", "5"])


def test_bursts_and_churn_fall_inside_the_run_and_alternate_engines(tmp_path: Path) -> None:
    from bench.soak_mixed import MixedConfig, Timeline

    cfg = MixedConfig(out_dir=tmp_path, duration_s=7200)
    assert cfg.window_s == (3600, 7200) and cfg.fill_s == 600
    assert all(0 < a < b < 7200 for a, b in cfg.bursts() + cfg.churn())
    assert len(cfg.churn()) == 29 and cfg.churn()[0] == (240, 300)
    timeline = Timeline.of(cfg)
    leaves = [e for e in timeline.events if e[1] == "leave"]
    assert [e[2] for e in leaves[:4]] == [0, 1, 2, 0]
    assert timeline.due(250) == [(240, "leave", 0)] and timeline.due(250) == []
    assert cfg.bursts(1)[0][0] == cfg.bursts(0)[0][0] + cfg.burst_every_s / 2  # never two bursts at once
    assert {e[2] for e in timeline.events if e[1] == "burst_on"} == {0, 1}


def test_bounds_are_sized_to_fill_within_the_fill_time() -> None:
    from bench.soak_bounds import ENGINE_CACHE_BLOCKS, size_bounds
    from bench.soak_traffic import TrafficSpec

    spec = TrafficSpec(url="", rate=40, duration_s=7200)
    b = size_bounds(40, 600, spec.mix, spec.session_share, spec.chat_turns, burst_rate=120, admission_ttl_s=5)
    sessions_per_s = 40 * (0.45 * 0.5 + 0.25 / 3)
    assert b.session_max_entries == int(sessions_per_s * 600 * 0.8)
    assert b.state_max_entries == int(40 * 0.17 * 600 * 0.8)
    assert b.kv_events_max_blocks == ENGINE_CACHE_BLOCKS and b.admission_max_held == 150
    assert "--kv-events-max-blocks" not in b.sidecar_args("approx")


def test_the_piece_cache_is_a_bound_the_soak_sets_and_reads() -> None:
    from bench.soak_bounds import PIECE_CACHE_TOKENS, Bounds, bound_specs, read_fills

    b = Bounds(session_max_entries=50, state_max_entries=50, kv_events_max_blocks=2_000, approx_max_blocks=1_000,
               admission_max_held=10)
    args = b.sidecar_args("approx")
    assert args[args.index("--tokenizer-cache-tokens") + 1] == str(PIECE_CACHE_TOKENS)
    assert {s.name: s.limit for s in bound_specs(b, "approx")}["piece_cache_tokens"] == PIECE_CACHE_TOKENS
    page = ('loadaware_tokenizer_piece_cache{what="hits"} 900.0\n'
            'loadaware_tokenizer_piece_cache{what="tokens"} 49870.0\n')
    assert read_fills({}, page, 0)["piece_cache_tokens"] == 49_870


def test_a_bound_is_reached_then_held_or_not() -> None:
    from bench.soak_bounds import BoundSpec, judge, judge_events, judge_plateau

    spec = BoundSpec("x", 100, "")
    v = judge(spec, [(0, 10), (30, 95), (60, 70), (90, 100)])
    assert (v.reached, v.reached_at_s, v.held, v.dips) == (True, 30, True, 1)
    assert not judge(spec, [(0, 10), (30, 95), (60, 101)]).held  # over its limit
    assert not judge(spec, [(0, 10), (30, 95), (60, 50)]).held  # not back at it at the end
    assert not judge(spec, [(0, 10), (30, 50)]).reached
    events = judge_events(spec, [(1, 40), (3, 80)], [(1, 0), (3, 12)])
    assert (events.reached, events.reached_at_s, events.held) == (True, 3, True)
    assert not judge_plateau("s", [(0, 5), (10, 6), (20, 7)], "").held
    assert judge_plateau("s", [(0, 5), (10, 7), (20, 7)], "").held


def test_a_followup_404_is_excused_only_when_its_holder_left_in_between() -> None:
    from bench.soak_report import excused_404s

    churn = [{"t_s": 60.0, "action": "leave", "engine": "engine-0"},
             {"t_s": 90.0, "action": "back", "engine": "engine-0"}]
    followups = [{"t_s": 70.0, "parent_served_by": "engine-0", "parent_t_s": 50.0},  # left in between
                 {"t_s": 70.0, "parent_served_by": "engine-1", "parent_t_s": 50.0},  # another engine
                 {"t_s": 95.0, "parent_served_by": "engine-0", "parent_t_s": 66.0}]  # stored after it left
    followups.append({"t_s": 70.0, "parent_served_by": "engine-0", "parent_t_s": 62.0})  # routed there before
    assert excused_404s(followups, churn) == 2


def test_arrivals_are_denser_in_bursts() -> None:
    from bench.soak_traffic import TrafficSpec, arrival_offsets

    offsets = arrival_offsets(TrafficSpec(url="", rate=50, duration_s=60, bursts=[(20.0, 40.0)], burst_factor=3))
    inside = sum(1 for t in offsets if 20 <= t < 40)
    assert 2.5 < (inside / 20) / ((len(offsets) - inside) / 40) < 3.5  # per second, inside against outside


def test_the_picker_config_keeps_the_shipped_one_but_its_ports_and_hosts(tmp_path: Path) -> None:
    from bench.soak_mixed import picker_envoy_config

    fleet = ["127.0.78.2:41000", "127.0.78.3:41000", "127.0.78.4:41000"]
    out = picker_envoy_config(fleet, listen=42001, admin=42002, sidecar=42003, out=tmp_path / "picker.yaml")
    config = yaml.safe_load(out.read_text())
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    hosts = [e["endpoint"]["address"]["socket_address"]
             for e in clusters["engines"]["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert [f"{h['address']}:{h['port_value']}" for h in hosts] == fleet
    picker = clusters["loadaware"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert picker["address"]["socket_address"]["port_value"] == 42003
    assert config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] == 42001
    assert "FULL_DUPLEX_STREAMED" in out.read_text()


def test_label_sets_fold_engine_addresses_and_name_what_came_late() -> None:
    from bench.soak_bounds import folded_series, new_after, note_first_seen

    page = ['# HELP x', 'loadaware_inflight_requests{endpoint="10.0.0.1:8000"} 2',
            'loadaware_inflight_requests{endpoint="10.0.0.2:8000"} 0',
            'inference_pool_per_pod_queue_size{model_server_pod="10.0.0.1:8000",name="default"} 1',
            'loadaware_decisions_total{endpoint="none",outcome="shed",policy="loadaware"} 3', 'process_cpu 1.5', '']
    keys = folded_series("\n".join(page))
    # the two engines' series are one label set; values and comments are not label sets
    assert keys == {'loadaware_inflight_requests{endpoint="*"}',
                    'inference_pool_per_pod_queue_size{model_server_pod="*",name="default"}',
                    'loadaware_decisions_total{endpoint="*",outcome="shed",policy="loadaware"}', 'process_cpu'}
    # an engine that comes back under a new address adds nothing; a tenant's new label value does
    seen: dict[str, float] = {}
    note_first_seen(seen, keys, 0.0)
    note_first_seen(seen, folded_series('loadaware_inflight_requests{endpoint="10.0.0.9:8000"} 1\n'), 50.0)
    assert new_after(seen, 30.0) == []
    note_first_seen(seen, folded_series('flow{tenant="b"} 1\nflow{tenant="a"} 1\n'), 60.0)
    assert new_after(seen, 30.0) == ['flow{tenant="a"}', 'flow{tenant="b"}']


def test_the_plateau_folds_the_codes_closed_sets_but_not_a_label_that_takes_the_inputs_values() -> None:
    from bench.soak_bounds import CLOSED_LABELS, ENDPOINT_LABELS, folded_series

    both = (*ENDPOINT_LABELS, *CLOSED_LABELS)
    early = 'loadaware_endpoint_ejections_total{endpoint="10.0.0.1:8000",reason="failing"} 1\n'
    late = early + 'loadaware_endpoint_ejections_total{endpoint="10.0.0.2:8000",reason="unreachable"} 1\n'
    assert len(folded_series(late)) == 2 and folded_series(late, both) == folded_series(early, both)
    tenants = 'flow{tenant="a",outcome="ok"} 1\nflow{tenant="b",outcome="shed"} 1\n'
    assert folded_series(tenants, both) == {'flow{outcome="*",tenant="a"}', 'flow{outcome="*",tenant="b"}'}


def test_growth_is_given_by_its_two_ends_and_by_the_line_through_every_sample() -> None:
    from bench.soak import Sample
    from bench.soak_report import growth_pct

    # a flat series with one burst's swing on its last sample: the ends say +10%, the line much less
    values = [100.0] * 10 + [110.0]
    samples = [Sample(float(t * 360), rss_mb=v, cpu_s=0.0, heap_mb=0.0, anon_mb=0.0) for t, v in enumerate(values)]
    g = growth_pct(samples, "rss_mb", 0.0, 3600.0)
    assert g is not None and g["pct"] == 10.0
    assert 0 < g["fit_pct"] < 5
    rising = [Sample(float(t * 360), rss_mb=100.0 + t, cpu_s=0.0, heap_mb=0.0, anon_mb=0.0) for t in range(11)]
    r = growth_pct(rising, "rss_mb", 0.0, 3600.0)
    assert r is not None and r["fit_pct"] == r["pct"] == 10.0 and r["fit_per_h"] == 10.0


def test_the_trend_names_the_site_that_grows_in_every_interval_not_the_one_a_moment_held(tmp_path: Path) -> None:
    import tracemalloc

    from bench.soak_diff import steady_growth

    kept: list[str] = []
    moment: list[str] = []

    def grow(n: int) -> None:
        kept.extend(f"kept-{len(kept) + i:09d}" for i in range(n))  # a site that only grows

    def hold(n: int) -> None:
        moment[:] = [f"moment-{i:09d}" for i in range(n)]  # up and down: what was in flight at that moment

    tracemalloc.start(4)
    try:
        paths = []
        for k, held in enumerate((500, 0, 3000, 10)):
            grow(200)
            hold(held)
            path = tmp_path / f"snap-{k:04d}.tracemalloc"
            tracemalloc.take_snapshot().dump(str(path))
            path.with_suffix(".json").write_text(json.dumps({"unix_time": 60.0 * k}))
            paths.append(path)
    finally:
        tracemalloc.stop()
    lines = steady_growth(paths, top=5)
    assert lines[0].startswith("4 snapshots over 180 s")
    grow_site = f"test_soak.py:{grow.__code__.co_firstlineno + 1}"
    hold_site = f"test_soak.py:{hold.__code__.co_firstlineno + 1}"
    assert grow_site in lines[1] and "+12000/h" in lines[1]  # 200 strings a minute, the first site shown
    assert not any(hold_site in line for line in lines) and len(moment) == 10


def test_every_failure_is_counted_by_its_minute_though_only_the_first_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The detail of the first FAILURES_KEPT failures, and the minute of every one: a run's failures after the
    first hundred can still be placed in time (which half of the run, beside what)."""
    from bench import soak_traffic
    from bench.soak_traffic import FAILURES_KEPT, Traffic, TrafficSpec
    traffic = Traffic(TrafficSpec(url="http://127.0.0.1:1", rate=1.0, duration_s=1.0))
    clock = iter([10.0 + k for k in range(FAILURES_KEPT)] + [3_700.0, 3_705.0, 3_710.0])
    monkeypatch.setattr(soak_traffic.time, "monotonic", lambda: next(clock))
    for _ in range(FAILURES_KEPT + 3):
        traffic.tally("chat", "http:503", "upstream connect error")
    traffic.tally("chat", "ok")
    traffic.tally("responses", "followup_404")
    r = traffic.result
    assert r.failed == FAILURES_KEPT + 3 and len(r.failures) == FAILURES_KEPT
    assert r.failed_per_minute == {"0": 50, "1": 50, "61": 3}
