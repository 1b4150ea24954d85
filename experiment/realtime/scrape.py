"""An engine's Prometheus text -> one `EngineSample` (the five vLLM v1 series the reference used).

Only the lines we need are parsed, by name prefix, so a scrape of a busy engine costs microseconds in the
sender's event loop (which also times every streamed token). Labels are ignored: one engine exposes one
series per name (vLLM's `engine="0"`); if several appear (data-parallel ranks) they are summed, which is
what "the engine's running requests" means.
"""

from __future__ import annotations

from experiment.records import EngineSample

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
_WANTED = (RUNNING, WAITING, KV_USAGE, PREFIX_QUERIES, PREFIX_HITS)


def parse_engine_metrics(text: str) -> dict[str, float]:
    """{series name: value summed over label sets} for the five series; missing ones are absent."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_end = len(line)
        for i, ch in enumerate(line):
            if ch in "{ ":
                name_end = i
                break
        name = line[:name_end]
        if name not in _WANTED:
            continue
        try:
            value = float(line.rsplit(None, 1)[-1])
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def to_sample(t: float, engine: str, text: str) -> EngineSample:
    """A sample from one scrape; a series the engine does not expose reads 0 (and is visible as such)."""
    v = parse_engine_metrics(text)
    return EngineSample(t, engine, v.get(RUNNING, 0.0), v.get(WAITING, 0.0), v.get(KV_USAGE, 0.0),
                        v.get(PREFIX_QUERIES, 0.0), v.get(PREFIX_HITS, 0.0))


def sum_by_label(text: str, metric: str, label: str) -> dict[str, float]:
    """{value of `label`: sum of `metric`'s samples} from any Prometheus text (the sidecar's counters)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(metric) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0]
        if name != metric:
            continue
        key = ""
        marker = f'{label}="'
        i = head.find(marker)
        if i >= 0:
            j = head.find('"', i + len(marker))
            key = head[i + len(marker) : j]
        try:
            out[key] = out.get(key, 0.0) + float(value)
        except ValueError:
            continue
    return out
