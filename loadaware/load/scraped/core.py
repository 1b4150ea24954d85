"""The core signals: every vLLM engine exports them and the tracker keeps each in a named EngineStats field
(load/tracker.py), the load formula and the token signals read them by name. Declared here so the parser, the
simulator and the documents read one table (loadaware/load/scraped/__init__.py)."""

from __future__ import annotations

import math

from loadaware.load.scraped.spec import ScrapedSignal

RUNNING = ScrapedSignal(
    "running", "vllm:num_requests_running", "Number of requests in model execution batches.", "requests",
    core=True, candidate="decode_batch", metric="loadaware_engine_running")
WAITING = ScrapedSignal(
    "waiting", "vllm:num_requests_waiting", "Number of requests waiting to be processed.", "requests",
    core=True, candidate="waiting", metric="loadaware_engine_waiting")
KV_USAGE = ScrapedSignal(
    "kv_usage", "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "fraction",
    average=True, aliases=("vllm:gpu_cache_usage_perc",),  # the deprecated name, still served by older engines
    core=True, candidate="kv_usage", metric="loadaware_engine_kv_cache_usage")
# The TTFT histogram's running totals: their deltas between scrapes give the engine's mean time to first token
# (the BUFFERED-mode prefill estimate, loadaware/load/prefill_estimate.py).
TTFT_SUM = ScrapedSignal(
    "ttft_sum", "vllm:time_to_first_token_seconds_sum", "Histogram of time to first token in seconds (sum).",
    "seconds", core=True)
TTFT_COUNT = ScrapedSignal(
    "ttft_count", "vllm:time_to_first_token_seconds_count", "Histogram of time to first token in seconds (count).",
    "requests", core=True)


def label_value(line: str, label: str) -> str | None:
    """The value of `label` in a sample line's label set (exact name: `block_size` is not
    `effective_attention_block_size`), None when absent. Values read here are numbers: no escapes."""
    for opener in ("{", ","):
        start = line.find(f'{opener}{label}="')
        if start >= 0:
            start += len(label) + 3
            end = line.find('"', start)
            return line[start:end] if end >= 0 else None
    return None


def _positive(text: str | None) -> float | None:
    """A label's value as a positive finite number, else None."""
    try:
        x = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return x if 0 < x < math.inf else None


def kv_capacity_tokens(line: str) -> float | None:
    """An engine's GPU KV cache in tokens from its cache_config_info sample: num_gpu_blocks x block_size, else
    kv_cache_size_tokens; None when neither is a positive number (e.g. "None" before profiling)."""
    blocks, size = _positive(label_value(line, "num_gpu_blocks")), _positive(label_value(line, "block_size"))
    if blocks is not None and size is not None:
        return blocks * size
    return _positive(label_value(line, "kv_cache_size_tokens"))


# An info gauge (value 1) whose labels carry the engine's KV cache configuration. Its size in tokens,
# num_gpu_blocks x block_size, is the room the fleet's prefix working set is measured against
# (loadaware/prefix/working_set.py); newer vLLM also labels kv_cache_size_tokens, the same product.
KV_CAPACITY = ScrapedSignal(
    "kv_capacity_tokens", "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "tokens",
    read=kv_capacity_tokens, core=True)
