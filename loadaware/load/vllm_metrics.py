"""Pure parsing of the few vLLM gauges the load tracker needs from an engine's Prometheus text exposition.

A hand parser on purpose: the sidecar parses every engine's page once per scrape interval on its event
loop. On a page shaped like a real vLLM v1 server's (~300 lines, 28 KiB, one engine) it costs 262 µs of
CPU against 3,244 µs for prometheus_client's parser (12x; `python -m bench.scrape_parse`, also case 5 of
`make bench`): with 100 engines scraped every second that is 2.6% of a core instead of 32%. A unit test
checks it reads the same values as prometheus_client on the same text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

WANTED = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage_legacy",  # deprecated name, still served by older engines
    # The TTFT histogram's running totals: their deltas between scrapes give the engine's mean time to first
    # token (the BUFFERED-mode prefill estimate, loadaware/load/prefill_estimate.py).
    "vllm:time_to_first_token_seconds_sum": "ttft_sum",
    "vllm:time_to_first_token_seconds_count": "ttft_count",
}


# An info gauge (value 1) whose labels carry the engine's KV cache configuration. Its size in tokens,
# num_gpu_blocks x block_size, is the room the fleet's prefix working set is measured against
# (loadaware/prefix/working_set.py); newer vLLM also labels kv_cache_size_tokens, the same product.
CACHE_CONFIG = "vllm:cache_config_info"


def parse_vllm_gauges(text: str) -> dict[str, float]:
    """Sum each wanted gauge over its label sets (a multi-engine server reports one series per engine).

    Returns keys among running, waiting, kv_usage, ttft_sum, ttft_count and kv_capacity_tokens (from the
    cache_config_info labels); a metric absent from the text is absent from the result. kv_usage is averaged
    over series rather than summed, since it is a fraction.
    """
    samples: list[tuple[str, float]] = []
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_end = len(line)
        for i, ch in enumerate(line):
            if ch == "{" or ch == " ":
                name_end = i
                break
        name = line[:name_end]
        key = WANTED.get(name)
        if key is None:
            if name == CACHE_CONFIG:
                capacity = kv_capacity_tokens(line)
                if capacity is not None:
                    samples.append(("kv_capacity_tokens", capacity))
            continue
        value_text = line.rsplit("}", 1)[-1].split()
        if not value_text:
            continue
        try:
            value = float(value_text[0])
        except ValueError:
            continue
        samples.append((key, value))
    return combine(samples)


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


def kv_capacity_tokens(line: str) -> float | None:
    """An engine's GPU KV cache in tokens from its cache_config_info sample: num_gpu_blocks x block_size, else
    kv_cache_size_tokens; None when neither is a positive number (e.g. "None" before profiling)."""
    blocks, size = _positive(label_value(line, "num_gpu_blocks")), _positive(label_value(line, "block_size"))
    if blocks is not None and size is not None:
        return blocks * size
    return _positive(label_value(line, "kv_cache_size_tokens"))


def _positive(text: str | None) -> float | None:
    """A label's value as a positive finite number, else None."""
    try:
        x = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return x if 0 < x < math.inf else None


def combine(samples: Iterable[tuple[str, float]]) -> dict[str, float]:
    """(wanted key, value) per series -> the gauges: sums over series, kv usage averaged (a fraction), the
    legacy kv name only when the current one is absent."""
    sums: dict[str, float] = {}
    series: dict[str, int] = {}
    for key, value in samples:
        sums[key] = sums.get(key, 0.0) + value
        series[key] = series.get(key, 0) + 1
    if "kv_usage" not in sums and "kv_usage_legacy" in sums:
        sums["kv_usage"], series["kv_usage"] = sums["kv_usage_legacy"], series["kv_usage_legacy"]
    sums.pop("kv_usage_legacy", None)
    if "kv_usage" in sums:
        sums["kv_usage"] /= series["kv_usage"]
    return sums
