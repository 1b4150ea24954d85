"""Real-time experiment plumbing without processes: arms, flags, Envoy rewrite, scrape parsing, outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from experiment.metrics import seed_metrics
from experiment.realtime import outputs
from experiment.realtime.arms import DEFAULT_ARMS, QUICK_ARMS, arm_by_name, parse_arms
from experiment.realtime.driver import (
    GATEWAYS,
    DriverConfig,
    Fleet,
    Gateway,
    _service_overrides,
    parse_seeds,
    rotated,
)
from experiment.realtime.driver import build_parser as driver_parser
from experiment.realtime.envoycfg import engines_config
from experiment.realtime.fleetctl import service_flags
from experiment.realtime.points import point_by_name
from experiment.realtime.scrape import parse_engine_metrics, sum_by_label, to_sample
from experiment.realtime.sender import SenderResult, SenderSpec, result_from_json
from experiment.records import EngineSample, RequestRecord
from sim.fleet import build_parser
from sim.service_model import ServiceModel, from_cli_args

ENGINE_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-model"} 7.0
vllm:num_requests_waiting{engine="0",model_name="tiny-model"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-model"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-model"} 15780.0
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-model"} 12288.0
vllm:prefix_cache_hits_created{engine="0",model_name="tiny-model"} 1.7e9
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny-model"} 0.0
"""


def test_arm_names_match_the_des_and_flags() -> None:
    assert arm_by_name("loadaware-b0.5").sidecar_args() == ["--policy", "loadaware", "--loadaware-beta", "0.5",
                                                             "--prefix-source", "lmcache"]
    kv = arm_by_name("loadaware-b1.0-kvev")
    assert kv.prefix_source == "kv-events" and kv.beta == 1.0 and kv.credit == "gpu"
    assert arm_by_name("kvaware").credit == "single"
    assert arm_by_name("roundrobin").credit == ""
    assert arm_by_name("loadaware-b3").name == "loadaware-b3.0"  # any beta, named as the DES names it
    assert arm_by_name("loadaware-b0").name == "loadaware-b0"
    spread = arm_by_name("lane-spread-kvev")  # every sidecar policy by its --policy name
    assert spread.sidecar_args()[:2] == ["--policy", "lane-spread"] and spread.credit == "gpu"
    with pytest.raises(ValueError):
        arm_by_name("predictive")  # a research policy: the sidecar no longer offers it
    with pytest.raises(ValueError):
        arm_by_name("random")
    with pytest.raises(ValueError):
        arm_by_name("sglang-router").sidecar_args()


def test_arm_sets() -> None:
    names = [a.name for a in parse_arms("all")]
    assert names == list(DEFAULT_ARMS)
    for want in ("kvaware", "loadaware-b0", "loadaware-b0.5", "loadaware-b1.0", "loadaware-b2.0", "roundrobin",
                 "leastload", "loadaware-b0.5-kvev", "loadaware-b1.0-kvev", "sglang-router", "vllm-router"):
        assert want in names
    assert [a.name for a in parse_arms("quick,kvaware")] == list(QUICK_ARMS)  # no duplicates


def test_seeds_and_rotation() -> None:
    assert parse_seeds("1-3,7,2") == [1, 2, 3, 7]
    arms = parse_arms("kvaware,roundrobin,leastload")
    assert [a.name for a in rotated(arms, 1)] == ["roundrobin", "leastload", "kvaware"]
    assert [a.name for a in rotated(arms, 3)] == ["kvaware", "roundrobin", "leastload"]
    with pytest.raises(ValueError):
        parse_seeds(",")


def test_service_flags_round_trip_through_the_fleet_parser() -> None:
    svc = ServiceModel(decode_base_ms=21.5, max_num_seqs=48, prefill_tokens_per_s=12_000.0)
    flags = service_flags(svc)
    assert "--decode-base-ms" in flags and "--block-size" not in flags  # defaults are left out
    args = build_parser().parse_args(["--engines", "2", *flags])
    assert from_cli_args(args) == svc
    assert _service_overrides(ServiceModel(), ["max_num_seqs=8", "decode_base_ms=3"]) == \
        ServiceModel(max_num_seqs=8, decode_base_ms=3.0)


def test_envoy_config_points_engines_at_the_fleet(tmp_path: Path) -> None:
    path = engines_config(["127.0.0.2:8000", "127.0.0.3:8000"], tmp_path)
    config = yaml.safe_load(path.read_text())
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    eps = clusters["engines"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [e["endpoint"]["address"]["socket_address"] for e in eps] == [
        {"address": "127.0.0.2", "port_value": 8000}, {"address": "127.0.0.3", "port_value": 8000}]
    # the rest of the gateway is the shipped one: override_host policy, ext_proc to the sidecar on :9002
    assert "override_host" in json.dumps(clusters["engines"]["load_balancing_policy"])
    sidecar = clusters["loadaware_sidecar"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert sidecar["endpoint"]["address"]["socket_address"]["port_value"] == 9002
    with pytest.raises(ValueError):
        engines_config([], tmp_path)


def test_picker_gateway_is_the_inference_pool_config_pointed_at_the_fleet(tmp_path: Path) -> None:
    assert driver_parser().parse_args([]).gateway == "buffered"
    assert driver_parser().parse_args(["--gateway", "picker"]).gateway == "picker"
    path = engines_config(["127.0.0.2:8000", "127.0.0.3:8000"], tmp_path, GATEWAYS["picker"])
    config = yaml.safe_load(path.read_text())
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    eps = clusters["engines"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [e["endpoint"]["address"]["socket_address"]["address"] for e in eps] == ["127.0.0.2", "127.0.0.3"]
    listener = config["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"]["port_value"] == 10001  # testkit.ports.PICKER_LISTEN_PORT
    # the Endpoint Picker Protocol's mode: the sidecar sees the response body, so its first chunk
    assert '"response_body_mode": "FULL_DUPLEX_STREAMED"' in json.dumps(listener)
    # a run waits for the fixed ports of its own gateway only
    gateways: tuple[tuple[Gateway, int, int], ...] = (("picker", 10001, 10000), ("buffered", 10000, 10001))
    for gateway, mine, other in gateways:
        cfg = DriverConfig(point_by_name("tiny"), parse_arms("kvaware"), [1], tmp_path, gateway=gateway)
        addresses = Fleet(cfg, tmp_path).fixed_addresses()
        assert ("127.0.0.1", mine) in addresses and ("127.0.0.1", other) not in addresses
        assert ("127.0.0.1", 9002) in addresses and ("127.0.0.2", 8000) in addresses


def test_engine_scrape_parsing() -> None:
    v = parse_engine_metrics(ENGINE_METRICS)
    assert v == {"vllm:num_requests_running": 7.0, "vllm:num_requests_waiting": 2.0,
                 "vllm:kv_cache_usage_perc": 0.25, "vllm:prefix_cache_queries_total": 15780.0,
                 "vllm:prefix_cache_hits_total": 12288.0}
    s = to_sample(3.5, "engine-0", ENGINE_METRICS)
    assert s == EngineSample(3.5, "engine-0", 7.0, 2.0, 0.25, 15780.0, 12288.0)
    assert to_sample(1.0, "e", "").running == 0.0


def test_sidecar_counters_by_label() -> None:
    text = ('# TYPE loadaware_decisions_total counter\n'
            'loadaware_decisions_total{endpoint="a",outcome="routed",policy="kvaware"} 3.0\n'
            'loadaware_decisions_total{endpoint="b",outcome="routed",policy="kvaware"} 4.0\n'
            'loadaware_decisions_total{endpoint="",outcome="passthrough",policy="kvaware"} 1.0\n'
            'loadaware_decisions_created{endpoint="a",outcome="routed",policy="kvaware"} 1.7e9\n')
    assert sum_by_label(text, "loadaware_decisions_total", "outcome") == {"routed": 7.0, "passthrough": 1.0}


def _result() -> SenderResult:
    reqs = [RequestRecord(0, 10.0, "engine-0", 10.1, 12.0, [0.04, 0.05], True, None, 1578, 3, 0),
            RequestRecord(1, 10.5, "engine-1", None, 10.6, [], False, "http_503", 1578, 0, 2)]
    samples = [EngineSample(t, e, r, 0.0, 0.1, q, h) for t, e, r, q, h in
               [(9.9, "engine-0", 0, 0, 0), (9.9, "engine-1", 0, 0, 0),
                (11.0, "engine-0", 2, 1578, 1536), (11.0, "engine-1", 1, 1578, 0),
                (12.1, "engine-0", 0, 3156, 3072), (12.1, "engine-1", 0, 1578, 0)]]
    return SenderResult(reqs, samples, (9.9, 12.1), warmup_sent=4, cpu_s=0.5, errors={"http_503": 1})


def test_sender_result_round_trip_and_metrics(tmp_path: Path) -> None:
    res = _result()
    back = result_from_json(res.to_json())
    assert back.requests == res.requests and back.samples == res.samples and back.window == res.window
    m = seed_metrics(outputs.run_records(back, "kvaware", 3, 16.0))
    assert m.sent == 2 and m.errors == 1 and m.error_rate == 0.5
    assert m.slo_miss == 0.5  # the success met 150 ms (0.1 s); the failure counts as a miss
    outputs.append_seed_metrics(tmp_path, m)
    outputs.append_seed_metrics(tmp_path, m)
    loaded = outputs.load_per_seed(tmp_path)
    got = loaded["kvaware"][3]
    for f in ("imbalance", "prefix_hit_rate", "ttft_p95", "slo_miss", "sent"):
        a, b = getattr(got, f), getattr(m, f)
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b), f


def test_sender_spec_json_round_trip() -> None:
    spec = SenderSpec(url="http://127.0.0.1:10000", seed=2, workload={"rate": 4.0, "n_requests": 3},
                      engines={"engine-0": "http://127.0.0.2:8000"})
    back = SenderSpec.from_json(json.dumps(spec.__dict__))
    assert back == spec and back.workload_spec().rate == 4.0
