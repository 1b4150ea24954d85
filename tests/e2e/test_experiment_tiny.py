"""A tiny real-time experiment run in CI: 2 simulated engines, a real LMCache controller, Envoy + the sidecar
(LMCache and KV-events sources) and, when `make peers` has installed them, both peer routers; a few seconds
of traffic per arm, then the same files the report reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiment.realtime import outputs
from experiment.realtime.arms import parse_arms
from experiment.realtime.driver import DriverConfig, run_experiment
from experiment.realtime.points import point_by_name
from testkit.peers import peers_available
from testkit.require import requires_lmcache

pytestmark = [pytest.mark.e2e, requires_lmcache()]

SIDECAR_ARMS = "kvaware,loadaware-b0.5-kvev,roundrobin"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rt-tiny")
    arms = SIDECAR_ARMS + (",sglang-router,vllm-router" if peers_available() else "")
    cfg = DriverConfig(point=point_by_name("tiny"), arms=parse_arms(arms), seeds=[1, 2], out=out)
    infos = run_experiment(cfg)
    assert len(infos) == 2 * len(cfg.arms)
    return out


def test_every_pair_has_its_metrics(run: Path) -> None:
    per_seed = outputs.load_per_seed(run)
    arms = SIDECAR_ARMS.split(",") + (["sglang-router", "vllm-router"] if peers_available() else [])
    assert sorted(per_seed) == sorted(arms)
    # Latencies are checked against the engines' model and each other, never against wall-clock targets
    # that a busy machine would miss: every prefill (even a full cache hit) costs its fixed overhead.
    prefill_floor_s = point_by_name("tiny").service.prefill_overhead_ms / 1000
    for arm, seeds in per_seed.items():
        assert sorted(seeds) == [1, 2], arm
        for m in seeds.values():
            assert m.sent == 24 and m.errors == 0, (arm, m)
            assert prefill_floor_s <= m.ttft_p50 <= m.ttft_p95 and m.e2e_mean >= m.ttft_mean, (arm, m)
            assert 0.0 < m.itl_p50 <= m.itl_p95, (arm, m)
            # 16 prefixes of 512 tokens, warmed: most of each prompt is a prefix-cache hit on some engine
            assert 0.5 < m.prefix_hit_rate <= 1.0, (arm, m)
            assert m.throughput_req_s > 0


def test_sidecar_decided_every_request_and_engines_were_reset(run: Path) -> None:
    for arm in SIDECAR_ARMS.split(","):
        for seed in (1, 2):
            info = json.loads((outputs.run_dir(run, arm, seed) / "run.json").read_text())
            sent = info["warmup_sent"] + info["metrics"]["sent"]
            assert info["router_counters"]["decisions"] == {"routed": float(sent)}, info["router_counters"]
            assert not info["router_counters"]["fallbacks"], info["router_counters"]
    # the second run on the fleet found caches from the first and cleared them
    infos = [json.loads(p.read_text()) for p in run.glob("runs/*/seed-*/run.json")]
    assert sum(1 for i in infos if i["cache_blocks_cleared"] > 0) >= len(infos) - 1


def test_records_are_complete(run: Path) -> None:
    rec = outputs.load_run(run, "kvaware", 1)
    assert len(rec.requests) == 24
    assert all(r.engine in ("engine-0", "engine-1") for r in rec.requests)  # x-served-by through Envoy
    assert all(len(r.itl) == r.output_tokens - 1 == 7 for r in rec.requests)
    engines = {s.engine for s in rec.samples}
    assert engines == {"engine-0", "engine-1"}
    lo, hi = rec.window
    assert lo <= min(r.send_t for r in rec.requests) and hi >= max(r.end_t or 0 for r in rec.requests)
    config = outputs.load_config(run)
    assert config["point"]["engines"] == 2 and config["seeds"] == [1, 2]


def test_picker_gateway_lets_the_sidecar_see_first_tokens(tmp_path: Path) -> None:
    """`--gateway picker`: the sidecar arms go through envoy-inference-pool.yaml (full duplex), so the sidecar
    sees each response's first chunk: the default policy learns each engine's TTFT from them (BUFFERED cannot)."""
    cfg = DriverConfig(point=point_by_name("tiny"), arms=parse_arms("lane-spread-kvev"), seeds=[1], out=tmp_path,
                       gateway="picker")
    (info,) = run_experiment(cfg)
    assert info["metrics"]["errors"] == 0
    counters = info["router_counters"]
    assert counters["decisions"] == {"routed": float(info["warmup_sent"] + info["metrics"]["sent"])}, counters
    floor_s = point_by_name("tiny").service.prefill_overhead_ms / 1000
    assert set(counters["observed_ttft_s"]) == {"127.0.0.2:8000", "127.0.0.3:8000"}, counters
    assert all(v >= floor_s for v in counters["observed_ttft_s"].values()), counters
    assert outputs.load_config(tmp_path)["gateway"] == "picker"
