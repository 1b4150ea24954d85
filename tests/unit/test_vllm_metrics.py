"""The sidecar's hand parser for engine /metrics pages reads what prometheus_client reads."""

from __future__ import annotations

import pytest

from bench.scrape_parse import library_gauges as reference_reading
from loadaware.load.vllm_metrics import parse_vllm_gauges
from sim.metrics import EngineMetrics
from sim.vllm_exposition import vllm_exposition


@pytest.mark.parametrize("engines", [1, 2, 4])
def test_matches_prometheus_client_on_a_vllm_shaped_page(engines: int) -> None:
    text = vllm_exposition(engines=engines, running=7, waiting=2, kv_usage=0.25)
    ours = parse_vllm_gauges(text)
    assert ours == reference_reading(text)
    assert ours == {"running": 7.0 * engines, "waiting": 2.0 * engines, "kv_usage": 0.25,
                    "ttft_sum": 41.5 * engines, "ttft_count": 300.0 * engines}


def test_matches_prometheus_client_on_the_simulated_engine_page() -> None:
    gauges = {"vllm:num_requests_running": 3.0, "vllm:num_requests_waiting": 1.0, "vllm:kv_cache_usage_perc": 0.5}
    metrics = EngineMetrics("sim-model", lambda: gauges)
    metrics.ttft.observe(0.2)
    text = metrics.render()
    assert parse_vllm_gauges(text) == reference_reading(text) == {"running": 3.0, "waiting": 1.0, "kv_usage": 0.5,
                                                                  "ttft_sum": 0.2, "ttft_count": 1.0}


def test_legacy_kv_name_and_garbage_read_alike() -> None:
    text = 'vllm:gpu_cache_usage_perc{engine="0"} 0.25\nvllm:gpu_cache_usage_perc{engine="1"} 0.75\n'
    assert parse_vllm_gauges(text) == reference_reading(text) == {"kv_usage": 0.5}

