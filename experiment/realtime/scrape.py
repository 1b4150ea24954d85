"""An engine's Prometheus text -> one `EngineSample` (the five vLLM v1 series the reference used).

Labels are ignored: one engine exposes one series per name (vLLM's `engine="0"`); if several appear
(data-parallel ranks) they are summed, which is what "the engine's running requests" means. Parsing a
simulated engine's page (~100 lines) with prometheus_client's parser costs ~1 ms of CPU, so the sender
keeps the raw pages during a run and parses them afterwards.
"""

from __future__ import annotations

from experiment.records import EngineSample
from testkit import metrics_text

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
_WANTED = (RUNNING, WAITING, KV_USAGE, PREFIX_QUERIES, PREFIX_HITS)


def parse_engine_metrics(text: str) -> dict[str, float]:
    """{series name: value summed over label sets} for the five series; missing ones are absent."""
    out: dict[str, float] = {}
    for s in metrics_text.samples(text):
        if s.name in _WANTED:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def to_sample(t: float, engine: str, text: str) -> EngineSample:
    """A sample from one scrape; a series the engine does not expose reads 0 (and is visible as such)."""
    v = parse_engine_metrics(text)
    return EngineSample(t, engine, v.get(RUNNING, 0.0), v.get(WAITING, 0.0), v.get(KV_USAGE, 0.0),
                        v.get(PREFIX_QUERIES, 0.0), v.get(PREFIX_HITS, 0.0))


def sum_by_label(text: str, metric: str, label: str) -> dict[str, float]:
    """{value of `label`: sum of `metric`'s samples} from any Prometheus text (the sidecar's counters)."""
    return metrics_text.sum_by_label(text, metric, label)
