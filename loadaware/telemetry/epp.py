"""The metric families a Gateway API Inference Extension endpoint picker (EPP) exports, under their own names.

A gateway's existing dashboards and autoscalers query these names; the sidecar's own `loadaware_*` families
stay the primary telemetry. Names, types, labels and units follow the EPP's `pkg/epp/metrics` (the
upstream gateway-api-inference-extension project, and llm-d-router's copy of it); docs/monitoring.md lists
each family, what fills it here, and the source.

Cost on the hot path: the request counter and the duration histogram are touched once per request, at its
end, through cached label children. The pool gauges and the scheduler latency histogram are computed when
/metrics is rendered (the latter read from `loadaware_decision_seconds`, so they cannot disagree).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from loadaware.lifecycle import Decision
from loadaware.telemetry.exposition import LabelLayout, TextCollector, families_text, family_header

# The EPP's buckets for a request's whole duration (5 ms to an hour): long generations fit.
REQUEST_DURATION_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15,
                            20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)
# The EPP's canonical error codes for what the picker itself refuses (its errutil package).
ERROR_CODES = {"unknown_model": "BadRequest", "no_endpoints": "ServiceUnavailable",
               "no_eligible_endpoints": "ServiceUnavailable"}
SCHEDULER_E2E = "inference_extension_scheduler_e2e_duration_seconds"
PER_POD = "inference_pool_per_pod_queue_size"
PER_POD_HELP = "Scraped vllm:num_requests_waiting per engine with a fresh scrape"
PER_POD_LABELS = ("name", "model_server_pod")
_PER_POD_LAYOUT = LabelLayout(sorted(PER_POD_LABELS))  # (pod, pool): the written order, nothing to reorder
# The model label comes from request bodies: bounded, so clients cannot grow the series without end. A model
# no engine serves is never a label of its own; past the budget, new names share one.
MAX_MODEL_LABELS = 64
UNKNOWN_MODEL_LABEL = "(unknown model)"
OTHER_MODELS_LABEL = "(other models)"


class PodLoad(NamedTuple):
    """One engine of the pool as the EPP families show it; None where no fresh scrape is known (a named tuple:
    /metrics makes one per engine at every render, and a tuple is the cheapest record to make)."""

    pod: str  # the pod name when discovery knows it, else the engine's ip:port
    running: float | None
    waiting: float | None
    kv_usage: float | None  # 0..1


class EppMetrics:
    """A lifecycle listener (request counts and durations) and a collector (pool gauges, scheduler latency)."""

    def __init__(self, registry: CollectorRegistry, pool_name: str, pool: Callable[[], Sequence[PodLoad]],
                 decision_seconds: Histogram, clock: Callable[[], float]) -> None:
        self.pool_name = pool_name
        self._pool = pool
        self._decision_seconds = decision_seconds
        self._clock = clock  # wall clock, the same one Decision.at is taken with
        self.requests = Counter("inference_objective_request", "Requests the picker decided, by the model asked "
                                "for and the model served (the same here: no model rewriting)",
                                ["model_name", "target_model_name"], registry=registry)
        self.errors = Counter("inference_objective_request_error", "Requests the picker could not route, by the "
                              "EPP's error code (BadRequest: unknown model; ServiceUnavailable: no engine)",
                              ["model_name", "target_model_name", "error_code"], registry=registry)
        self.duration = Histogram("inference_objective_request_duration_seconds", "Request latency in seconds, from "
                                  "the routing decision's start to the end of the request's stream",
                                  ["model_name", "target_model_name"], buckets=REQUEST_DURATION_BUCKETS,
                                  registry=registry)
        self._request_children: dict[str, tuple[Counter, Histogram]] = {}
        registry.register(_PoolCollector(self))

    def model_label(self, decision: Decision) -> str:
        if decision.outcome == "unknown_model":
            return UNKNOWN_MODEL_LABEL
        model = decision.model or ""
        if model in self._request_children or len(self._request_children) < MAX_MODEL_LABELS:
            return model
        return OTHER_MODELS_LABEL

    # ---- lifecycle listener (hot path: cached children only) ----
    def on_decided(self, decision: Decision) -> None:
        code = ERROR_CODES.get(decision.outcome)
        if code is not None:
            model = self.model_label(decision)
            self.errors.labels(model, model, code).inc()

    def on_served(self, decision: Decision, previous: str | None) -> None:
        pass

    def on_ended(self, decision: Decision) -> None:
        model = self.model_label(decision)
        children = self._request_children.get(model)
        if children is None:
            children = self._request_children[model] = (self.requests.labels(model, model),
                                                         self.duration.labels(model, model))
        children[0].inc()
        children[1].observe(max(0.0, self._clock() - decision.at + decision.total_s))

    # ---- render time ----
    def collect_pool(self) -> Iterator[Metric]:
        pods = self._pool()
        yield from self._pool_gauges(pods, _scraped(pods))
        per_pod = GaugeMetricFamily(PER_POD, PER_POD_HELP, labels=list(PER_POD_LABELS))
        for p in pods:
            if p.running is not None and p.waiting is not None:
                per_pod.add_metric([self.pool_name, p.pod], p.waiting or 0.0)
        yield per_pod
        yield self._scheduler_e2e()

    def pool_text(self) -> str:
        """What generate_latest writes for collect_pool, with the one series per engine written by hand
        (telemetry/exposition.py)."""
        pods = self._pool()
        name = self.pool_name
        scraped = _scraped(pods)
        per_pod = _PER_POD_LAYOUT.lines(PER_POD, [((p.pod, name), float(p.waiting or 0.0)) for p in scraped])
        return (families_text(self._pool_gauges(pods, scraped)) + family_header(PER_POD, PER_POD_HELP, "gauge")
                + per_pod + families_text((self._scheduler_e2e(),)))

    def _pool_gauges(self, pods: Sequence[PodLoad], scraped: Sequence[PodLoad]) -> list[Metric]:
        """The pool's one-series gauges: its size and the means over its freshly scraped engines."""
        name = self.pool_name
        kv = [p.kv_usage for p in pods if p.kv_usage is not None]
        ready = GaugeMetricFamily("inference_pool_ready_pods", "Engines in the pool (the sidecar's fleet)",
                                  labels=["name"])
        ready.add_metric([name], len(pods))
        out: list[Metric] = [ready]
        families = (("inference_pool_average_kv_cache_utilization", "Mean scraped KV-cache usage (0-1) over the "
                     "pool's engines with a fresh scrape", _mean(kv)),
                    ("inference_pool_average_queue_size", "Mean scraped vllm:num_requests_waiting over the pool's "
                     "engines with a fresh scrape", _mean([p.waiting or 0.0 for p in scraped])),
                    ("inference_pool_average_running_requests", "Mean scraped vllm:num_requests_running over the "
                     "pool's engines with a fresh scrape", _mean([p.running or 0.0 for p in scraped])))
        for family_name, help_text, value in families:
            family = GaugeMetricFamily(family_name, help_text, labels=["name"])
            if value is not None:
                family.add_metric([name], value)
            out.append(family)
        return out

    def _scheduler_e2e(self) -> Metric:
        """`loadaware_decision_seconds` under the EPP's name (same buckets as the native histogram)."""
        family = HistogramMetricFamily(SCHEDULER_E2E, "End-to-end scheduling latency in seconds (one routing "
                                       "decision; the same observations as loadaware_decision_seconds)")
        buckets: list[tuple[str, float]] = []
        total = 0.0
        for metric in self._decision_seconds.collect():
            for sample in metric.samples:
                if sample.name.endswith("_bucket"):
                    buckets.append((sample.labels["le"], sample.value))
                elif sample.name.endswith("_sum"):
                    total = sample.value
        family.add_metric([], buckets, total)
        return family


class _PoolCollector(TextCollector):
    def __init__(self, epp: EppMetrics) -> None:
        self.epp = epp

    def collect(self) -> Iterator[Metric]:
        return self.epp.collect_pool()

    def exposition(self) -> str:
        return self.epp.pool_text()

    def describe(self) -> Iterator[Metric]:
        return iter(())  # computed at render: nothing to check for clashes up front


def _scraped(pods: Sequence[PodLoad]) -> list[PodLoad]:
    """The engines with a fresh scrape."""
    return [p for p in pods if p.running is not None and p.waiting is not None]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
