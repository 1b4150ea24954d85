"""A /metrics page shaped like a real vLLM v1 server's: the gauges, counters and histograms it exposes, per
engine, with Python process metrics around them. Used to measure and check scrape parsers on realistic
input (about 300 lines and 28 KB for one engine), not by the simulated engines themselves."""

from __future__ import annotations

GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "prompt_tokens", "generation_tokens")
HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "request_queue_time_seconds", "request_inference_time_seconds", "request_prefill_time_seconds",
              "request_decode_time_seconds", "request_prompt_tokens", "request_generation_tokens",
              "iteration_tokens_total")
BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
           80.0, 160.0, 640.0, 2560.0)


def vllm_exposition(engines: int = 1, running: float = 7.0, waiting: float = 2.0, kv_usage: float = 0.25,
                    model: str = "Qwen/Qwen2.5-3B-Instruct") -> str:
    """Each engine reports `running`, `waiting` and `kv_usage`; totals are engines x those."""
    values = {"num_requests_running": running, "num_requests_waiting": waiting, "kv_cache_usage_perc": kv_usage}
    labels = [f'model_name="{model}",engine="{e}"' for e in range(engines)]
    lines = ["# HELP python_gc_objects_collected_total Objects collected during gc",
             "# TYPE python_gc_objects_collected_total counter"]
    lines += [f'python_gc_objects_collected_total{{generation="{g}"}} {1000.0 * (g + 1)}' for g in range(3)]
    lines += ["# HELP process_resident_memory_bytes Resident memory size in bytes.",
              "# TYPE process_resident_memory_bytes gauge", "process_resident_memory_bytes 2.1e+09"]
    for name in GAUGES:
        lines += [f"# HELP vllm:{name} {name}", f"# TYPE vllm:{name} gauge"]
        lines += [f"vllm:{name}{{{lab}}} {values[name]}" for lab in labels]
    for name in COUNTERS:
        lines += [f"# HELP vllm:{name}_total {name}", f"# TYPE vllm:{name}_total counter"]
        lines += [f"vllm:{name}_total{{{lab}}} 123456.0" for lab in labels]
    for name in HISTOGRAMS:
        lines += [f"# HELP vllm:{name} {name}", f"# TYPE vllm:{name} histogram"]
        for lab in labels:
            lines += [f'vllm:{name}_bucket{{{lab},le="{b}"}} {10.0 * i}' for i, b in enumerate(BUCKETS)]
            lines += [f'vllm:{name}_bucket{{{lab},le="+Inf"}} 300.0', f"vllm:{name}_count{{{lab}}} 300.0",
                      f"vllm:{name}_sum{{{lab}}} 41.5"]
    return "\n".join(lines) + "\n"
