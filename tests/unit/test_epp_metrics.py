"""The endpoint picker's metric families (telemetry/epp.py), fed by lifecycle events and computed at render."""

from __future__ import annotations

from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.telemetry.decisions import DecisionMetrics
from loadaware.telemetry.epp import MAX_MODEL_LABELS, EppMetrics, PodLoad
from loadaware.telemetry.metrics import Metrics
from testkit.metrics_text import metric_sum, samples


class Wall:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rig(pods: list[PodLoad]) -> tuple[Metrics, RequestLifecycle, Wall]:
    metrics = Metrics("loadaware")
    wall = Wall()
    lifecycle = RequestLifecycle()
    lifecycle.subscribe(DecisionMetrics(metrics))
    lifecycle.subscribe(EppMetrics(metrics.registry, "pool-a", lambda: pods, metrics.decision_seconds, wall))
    return metrics, lifecycle, wall


def decision(outcome: str, model: str | None, at: float, total_s: float = 0.002) -> Decision:
    endpoint = "10.0.0.1:8000" if outcome == "routed" else None
    return Decision("r", endpoint, outcome, (), 10, (), (), {}, total_s, at=at, model=model)


def render(metrics: Metrics) -> str:
    return metrics.render(dict, ()).decode()


def test_requests_errors_and_durations_by_model() -> None:
    metrics, lifecycle, wall = rig([])
    for outcome, model, seconds in (("routed", "m1", 1.5), ("routed", "m1", 0.3), ("unknown_model", "nope", 0.0),
                                    ("no_endpoints", None, 0.0)):
        d = decision(outcome, model, at=wall.now)
        lifecycle.decided(d)
        wall.now += seconds
        lifecycle.ended(d)
    text = render(metrics)
    m1 = {"model_name": "m1", "target_model_name": "m1"}
    assert metric_sum(text, "inference_objective_request_total", m1) == 2
    assert metric_sum(text, "inference_objective_request_total") == 4
    assert metric_sum(text, "inference_objective_request_error_total",
                      {"model_name": "(unknown model)", "error_code": "BadRequest"}) == 1
    assert 'model_name="nope"' not in text  # a name no engine serves is never a label
    assert metric_sum(text, "inference_objective_request_error_total",
                      {"model_name": "", "error_code": "ServiceUnavailable"}) == 1
    assert metric_sum(text, "inference_objective_request_error_total", m1) == 0
    # Each duration runs from the decision's start (at - total_s) to the end.
    assert abs(metric_sum(text, "inference_objective_request_duration_seconds_sum", m1) - (1.502 + 0.302)) < 1e-9
    assert metric_sum(text, "inference_objective_request_duration_seconds_bucket", {**m1, "le": "0.4"}) == 1
    assert metric_sum(text, "inference_objective_request_duration_seconds_bucket", {**m1, "le": "2.0"}) == 2


def test_model_labels_are_bounded() -> None:
    metrics, lifecycle, wall = rig([])
    for i in range(MAX_MODEL_LABELS + 10):
        d = decision("routed", f"model-{i}", at=wall.now)
        lifecycle.decided(d)
        lifecycle.ended(d)
    d = decision("routed", "model-0", at=wall.now)  # an early model keeps its own series
    lifecycle.decided(d)
    lifecycle.ended(d)
    text = render(metrics)
    models = {s.labels["model_name"] for s in samples(text) if s.name == "inference_objective_request_total"}
    assert len(models) == MAX_MODEL_LABELS + 1 and "(other models)" in models
    assert metric_sum(text, "inference_objective_request_total", {"model_name": "(other models)"}) == 10
    assert metric_sum(text, "inference_objective_request_total", {"model_name": "model-0"}) == 2


def test_scheduler_latency_is_the_native_decision_histogram() -> None:
    metrics, lifecycle, wall = rig([])
    for total in (0.0003, 0.004, 0.2):
        lifecycle.decided(decision("routed", "m", at=wall.now, total_s=total))
    text = render(metrics)
    native = {(s.labels["le"], s.value) for s in samples(text) if s.name == "loadaware_decision_seconds_bucket"}
    epp = {(s.labels["le"], s.value) for s in samples(text)
           if s.name == "inference_extension_scheduler_e2e_duration_seconds_bucket"}
    assert epp == native and ("0.0005", 1.0) in epp
    assert metric_sum(text, "inference_extension_scheduler_e2e_duration_seconds_count") == 3
    assert abs(metric_sum(text, "inference_extension_scheduler_e2e_duration_seconds_sum") - 0.2043) < 1e-9


def test_pool_gauges_average_fresh_scrapes_only() -> None:
    pods = [PodLoad("pod-a", 2, 4, 0.5), PodLoad("pod-b", 0, 1, 0.1), PodLoad("10.0.0.3:8000", None, None, None)]
    metrics, _, _ = rig(pods)
    text = render(metrics)
    pool = {"name": "pool-a"}
    assert metric_sum(text, "inference_pool_ready_pods", pool) == 3
    assert metric_sum(text, "inference_pool_average_running_requests", pool) == 1.0
    assert metric_sum(text, "inference_pool_average_queue_size", pool) == 2.5
    assert abs(metric_sum(text, "inference_pool_average_kv_cache_utilization", pool) - 0.3) < 1e-9
    per_pod = {s.labels["model_server_pod"]: s.value for s in samples(text)
               if s.name == "inference_pool_per_pod_queue_size"}
    assert per_pod == {"pod-a": 4, "pod-b": 1}


def test_no_scrape_means_no_average_rather_than_zero() -> None:
    metrics, _, _ = rig([PodLoad("10.0.0.3:8000", None, None, None)])
    text = render(metrics)
    assert metric_sum(text, "inference_pool_ready_pods") == 1
    assert not [s for s in samples(text) if s.name.startswith("inference_pool_average")]


def test_the_hot_path_bench_runs() -> None:
    from research.probes.epp_listener import run, table

    result = run(quick=True)
    assert result["lifecycle_with_epp_us"] > 0 and result["lookup_counted_us"] > 0
    assert "lifecycle events" in table(result)
