"""Admission's families (--admission): held requests and their outcomes by priority, the pool's saturation.

A group of Metrics (telemetry/metrics.py), which mixes it in: callers see one object.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class FlowControlFamilies:
    def _declare_flow_control_metrics(self, r: CollectorRegistry) -> None:
        # The EPP's flow-control families (llm_d_epp_flow_control_*, formerly inference_extension_flow_control_*)
        # under this sidecar's prefix. Priority values come from the objectives table, never from a client.
        self.flow_queue_size = Gauge("loadaware_flow_control_queue_size", "Requests held in admission, by priority",
                                     ["priority"], registry=r)
        self.flow_queue_bytes = Gauge("loadaware_flow_control_queue_bytes", "Bytes of the requests held in "
                                      "admission, by priority", ["priority"], registry=r)
        self.flow_queue_seconds = Histogram("loadaware_flow_control_request_queue_duration_seconds",
                                            "Time a request spent held in admission, by priority and outcome",
                                            ["priority", "outcome"], buckets=QUEUE_BUCKETS, registry=r)
        self.flow_requests = Counter("loadaware_flow_control_requests", "Admission outcomes by priority "
                                     "(admitted, released, placed_ttl, placed_full, rejected_queue_full, "
                                     "rejected_ttl, evicted)", ["priority", "outcome"], registry=r)
        self.flow_saturation = Gauge("loadaware_flow_control_pool_saturation", "Share of eligible endpoints "
                                     "saturated (1: the pool is, and new requests are held)", registry=r)
        self.flow_top_wait_floor = Gauge("loadaware_flow_control_top_wait_floor", "Share of the top priority's "
                                         "arrivals that must find no free batch slot if the priorities that cannot "
                                         "be shed are all served (rho^(free slots); above 0.05 its p95 cannot be "
                                         "protected; NaN while unknown)", registry=r)
        self._flow_children: dict[tuple[int, str], tuple[Counter, Histogram]] = {}

    def admission(self, priority: int, outcome: str, wait_s: float) -> None:
        key = (priority, outcome)
        children = self._flow_children.get(key)
        if children is None:
            labels = (str(priority), outcome)
            children = self._flow_children[key] = (self.flow_requests.labels(*labels),
                                                   self.flow_queue_seconds.labels(*labels))
        children[0].inc()
        children[1].observe(wait_s)

    def held(self, bands: dict[int, tuple[int, int]]) -> None:
        for priority, (count, size) in bands.items():
            self.flow_queue_size.labels(str(priority)).set(count)
            self.flow_queue_bytes.labels(str(priority)).set(size)
