"""vLLM v1 metrics of one simulated engine, rendered in the Prometheus text format.

Hand-rolled instead of prometheus_client: no process-global state (many engines share one process, and
the sidecar may share it in tests), no `_created` series, and rendering is a few string joins.
Names and labels follow vLLM v1 (`model_name`, `engine="0"`); histogram buckets are vLLM's.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loadaware.load.scraped import SIGNALS

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass
class Histogram:
    buckets: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.n += 1


def _fmt(v: float) -> str:
    return repr(float(v)) if not float(v).is_integer() else f"{float(v):.1f}"


class EngineMetrics:
    """Counters and histograms the engine updates; gauges are read from callbacks at scrape time."""

    def __init__(self, model_name: str, gauges: Callable[[], dict[str, float]],
                 cache_config: tuple[int, int] | None = None) -> None:
        self.labels = f'engine="0",model_name="{model_name}"'
        self.cache_config = cache_config  # (num_gpu_blocks, block_size): vllm:cache_config_info's labels
        self._gauges = gauges
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.request_success = 0
        self.num_preemptions = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue_time = Histogram(TTFT_BUCKETS)

    def render(self) -> str:
        lb = self.labels
        lines: list[str] = []
        help_texts = {s.gauge: s.help for s in SIGNALS}  # the sidecar's table of scraped signals (load/scraped/)
        for name, value in self._gauges().items():
            lines += [f"# HELP {name} {help_texts.get(name, name)}", f"# TYPE {name} gauge",
                      f"{name}{{{lb}}} {_fmt(value)}"]
        if self.cache_config is not None:
            # vLLM's info gauge: the cache configuration in labels (a subset of vLLM's, in its sorted order).
            blocks, size = self.cache_config
            name = "vllm:cache_config_info"
            lines += [f"# HELP {name} Information of the LLMEngine CacheConfig", f"# TYPE {name} gauge",
                      f'{name}{{block_size="{size}",enable_prefix_caching="True",engine="0",'
                      f'num_gpu_blocks="{blocks}"}} 1.0']
        for name, value, help_text in (
            ("vllm:num_preemptions", self.num_preemptions, "Cumulative number of preemption from the engine."),
            ("vllm:prefix_cache_queries", self.prefix_cache_queries, "Prefix cache queries, in terms of tokens."),
            ("vllm:prefix_cache_hits", self.prefix_cache_hits, "Prefix cache hits, in terms of tokens."),
            ("vllm:prompt_tokens", self.prompt_tokens, "Number of prefill tokens processed."),
            ("vllm:generation_tokens", self.generation_tokens, "Number of generation tokens processed."),
        ):
            lines += [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total counter",
                      f"{name}_total{{{lb}}} {_fmt(value)}"]
        name = "vllm:request_success"
        lines += [f"# HELP {name}_total Count of successfully processed requests.", f"# TYPE {name}_total counter",
                  f'{name}_total{{{lb},finished_reason="length"}} {_fmt(self.request_success)}']
        for name, hist, help_text in (
            ("vllm:time_to_first_token_seconds", self.ttft, "Histogram of time to first token in seconds."),
            ("vllm:e2e_request_latency_seconds", self.e2e, "Histogram of e2e request latency in seconds."),
            ("vllm:request_queue_time_seconds", self.queue_time, "Histogram of time spent in WAITING phase."),
        ):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
            cumulative = 0
            for bound, count in zip(hist.buckets, hist.counts):
                cumulative += count
                lines.append(f'{name}_bucket{{{lb},le="{_fmt(bound)}"}} {_fmt(cumulative)}')
            lines.append(f'{name}_bucket{{{lb},le="+Inf"}} {_fmt(hist.n)}')
            lines.append(f"{name}_count{{{lb}}} {_fmt(hist.n)}")
            lines.append(f"{name}_sum{{{lb}}} {_fmt(hist.total)}")
        return "\n".join(lines) + "\n"
