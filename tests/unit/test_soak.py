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


def test_soak_flags_reach_its_config() -> None:
    from bench.run import build_config, parse_args, soak_config

    args = parse_args(["--cases", "soak", "--soak-rate", "60", "--soak-prefix-sources", "approx"])
    soak = soak_config(args, build_config(args))
    assert (soak.rate, soak.prefix_sources) == (60.0, "approx")
    default = parse_args(["--cases", "soak"])
    assert soak_config(default, build_config(default)).prefix_sources == "kv-events,approx"
