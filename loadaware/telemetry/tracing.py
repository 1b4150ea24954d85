"""Traces: W3C trace context in, one OpenTelemetry span per routing decision out, exported as OTLP/HTTP JSON.

Off unless `--otlp-endpoint` names a collector; then `app.py` builds one `Tracing`, subscribes it to the request
lifecycle and hands it to the ext_proc server, which calls `begin` when it sends a decision's reply.

- **Parent.** The request's `traceparent` (read by the one header scan every request already gets) is parsed
  here without trusting it (`parse_traceparent`); a valid one is the span's remote parent, anything else starts
  a new trace. `tracestate` is not touched: Envoy forwards the client's unchanged.
- **Sampling.** Parent-based: a parent that says sampled is always traced, one that says not sampled never is;
  a new trace is sampled at `--trace-sample-ratio` (by its trace id, as every OpenTelemetry SDK does).
- **Propagation.** `begin` returns the `traceparent` the upstream request must carry, naming the sidecar's span
  as its parent (the same trace id, flags as sampled); the ext_proc reply sets it (extproc/traced.py).
- **The span.** `loadaware.route`, kind SERVER, starts when the sidecar began on the request (the decision's
  time minus its duration, minus its wait in the admission queue when it was held) and ends at the decision:
  it measures what the sidecar added to the request, and the engine's own spans, children of it through the
  propagated header, follow it. It does not stay open until the response: its attributes are set and it ends
  when the request ends (`on_ended`, off the path between the decision and its reply), so it can carry the
  response's status and the engine that served; an unsampled request costs the id and the header alone.
- **Export.** Ended spans wait in a bounded queue (`QUEUE_LIMIT`; past it a span is dropped and counted); a
  background task sends them every `EXPORT_INTERVAL_S` in batches to `<endpoint>/v1/traces` as OTLP/HTTP JSON
  (the OTLP specification's JSON encoding), each POST time-boxed, encoded in a worker thread. A failed batch
  is counted and dropped, never retried: a request never waits for, and never fails because of, the exporter.
  (Why not the OpenTelemetry OTLP exporters: xds-protos ships its own, older copy of the `opentelemetry.proto`
  modules, which the exporters' `opentelemetry-proto` would overwrite, or be overwritten by.)

`loadaware_trace_spans_total{result}` counts spans exported, dropped (queue full) and failed (the POST).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)
from prometheus_client import CollectorRegistry, Counter

from loadaware.lifecycle import Decision
from loadaware.telemetry.faults import RateLimitedLog, describe

log = logging.getLogger(__name__)
quiet = RateLimitedLog(log)  # a collector that is down fails every batch: one line per interval

SERVICE_NAME = "loadaware-sidecar"
SCOPE_NAME = "loadaware"
SPAN_NAME = "loadaware.route"
TRACES_PATH = "/v1/traces"
QUEUE_LIMIT = 4096  # ended spans waiting for export; past it new ones are dropped (and counted)
BATCH_LIMIT = 512  # spans per POST
EXPORT_INTERVAL_S = 1.0
EXPORT_TIMEOUT_S = 5.0  # one POST, connection included
CLOSE_TIMEOUT_S = 2.0  # the last export when the sidecar stops

_HEX = frozenset("0123456789abcdef")
_SAMPLED = 0x01
# OTLP's Span.flags: bit 8 says whether bit 9 (the parent is remote) is known.
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
_OTLP_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4,
              SpanKind.CONSUMER: 5}
_OTLP_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


@dataclass(frozen=True, slots=True)
class TraceParent:
    trace_id: int
    span_id: int  # the caller's span: the parent of the sidecar's
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & _SAMPLED)


def _hex(text: str) -> bool:
    return bool(text) and set(text) <= _HEX


def parse_traceparent(value: str) -> TraceParent | None:
    """A W3C `traceparent` (version-traceid-parentid-flags, lower-case hex), or None for anything else: a wrong
    length or separator, upper case, a trace or parent id of zeros, version ff. A later version (01-fe) is read
    as version 00 when its first 55 characters fit and anything after them starts with '-' (W3C's rule)."""
    value = value.strip(" \t")
    if len(value) < 55 or value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    version, trace_id, span_id, flags = value[:2], value[3:35], value[36:52], value[53:55]
    if not _hex(version) or version == "ff" or (version == "00" and len(value) != 55):
        return None
    if len(value) > 55 and value[55] != "-":
        return None
    if not (_hex(trace_id) and _hex(span_id) and _hex(flags)):
        return None
    parsed = TraceParent(int(trace_id, 16), int(span_id, 16), int(flags, 16))
    if not parsed.trace_id or not parsed.span_id:
        return None
    return parsed


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}"


def traces_url(endpoint: str) -> str:
    """The collector's traces URL: `endpoint` as given when it already ends in /v1/traces, else with it added
    (OTEL_EXPORTER_OTLP_ENDPOINT's convention: the base address of an OTLP/HTTP receiver)."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


class SpanQueue(SpanProcessor):
    """The SDK's span processor: an ended, sampled span joins a bounded queue; the export task takes it."""

    def __init__(self, limit: int, dropped: Counter) -> None:
        self.spans: deque[ReadableSpan] = deque()
        self.limit = limit
        self._dropped = dropped

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if len(self.spans) >= self.limit:
            self._dropped.inc()
            return
        self.spans.append(span)

    def take(self, limit: int) -> list[ReadableSpan]:
        spans = self.spans
        return [spans.popleft() for _ in range(min(limit, len(spans)))]

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class Tracing:
    """The sidecar's tracer: `begin` at the reply, a lifecycle listener that ends the span, the export task."""

    def __init__(self, endpoint: str, sample_ratio: float, registry: CollectorRegistry | None = None,
                 interval_s: float = EXPORT_INTERVAL_S, timeout_s: float = EXPORT_TIMEOUT_S,
                 queue_limit: int = QUEUE_LIMIT) -> None:
        self.url = traces_url(endpoint)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        spans = Counter("loadaware_trace_spans", "Routing-decision spans by what became of them: exported to the "
                        "OTLP collector, dropped (the export queue was full), failed (their batch's POST failed)",
                        ["result"], registry=registry)
        self._exported, self._failed = spans.labels("exported"), spans.labels("failed")
        self.queue = SpanQueue(queue_limit, spans.labels("dropped"))
        resource = Resource.create({"service.name": SERVICE_NAME})
        self._resource = [_attribute(k, v) for k, v in resource.attributes.items()]
        self.provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
        self.provider.add_span_processor(self.queue)
        self._tracer = self.provider.get_tracer(SCOPE_NAME)
        self._empty = Context()

    # ---- the request's side ----
    def begin(self, decision: Decision, traceparent: str) -> str:
        """Start `decision`'s span, a child of the request's `traceparent` (a new trace if it has none or a
        bad one); the traceparent the upstream request carries, naming the span."""
        parent = parse_traceparent(traceparent) if traceparent else None
        context = self._empty
        if parent is not None:
            context = set_span_in_context(NonRecordingSpan(SpanContext(
                parent.trace_id, parent.span_id, is_remote=True, trace_flags=TraceFlags(parent.flags & 0xFF))),
                context)
        span = self._tracer.start_span(SPAN_NAME, context=context, kind=SpanKind.SERVER,
                                       start_time=_started_ns(decision))
        decision.trace = span
        own = span.get_span_context()
        return format_traceparent(own.trace_id, own.span_id, own.trace_flags)

    # ---- lifecycle listener ----
    def on_decided(self, decision: Decision) -> None:
        pass

    def on_served(self, decision: Decision, previous: str | None) -> None:
        pass

    def on_ended(self, decision: Decision) -> None:
        span: Span | None = decision.trace
        if span is None:
            return
        decision.trace = None  # the recent-decisions ring keeps decisions: it need not keep their spans
        if not span.is_recording():
            return
        span.set_attributes(span_attributes(decision))
        span.end(end_time=int(decision.at * 1e9))

    # ---- export ----
    async def run(self) -> None:
        """The export task (supervised): every interval, what the queue holds, batch by batch."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as session:
            while True:
                await asyncio.sleep(self.interval_s)
                await self.export_queued(session)

    async def export_queued(self, session: aiohttp.ClientSession) -> None:
        while self.queue.spans:
            await self._post(session, self.queue.take(BATCH_LIMIT))

    async def close(self) -> None:
        """The last export when the sidecar stops (its open streams ended first), within CLOSE_TIMEOUT_S."""
        if not self.queue.spans:
            return
        try:
            timeout = aiohttp.ClientTimeout(total=min(self.timeout_s, CLOSE_TIMEOUT_S))
            async with aiohttp.ClientSession(timeout=timeout) as session:
                await asyncio.wait_for(self.export_queued(session), CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - stopping goes on whatever the collector does (a time-out too)
            quiet.log(logging.WARNING, "close", "trace export at shutdown failed: %s", describe(exc))

    async def _post(self, session: aiohttp.ClientSession, spans: list[ReadableSpan]) -> None:
        try:
            body = await asyncio.to_thread(encode, spans, self._resource)
            async with session.post(self.url, data=body, headers={"Content-Type": "application/json"}) as resp:
                if resp.status // 100 != 2:
                    raise RuntimeError(f"HTTP {resp.status}")
        except asyncio.CancelledError:
            self._failed.inc(len(spans))
            raise
        except Exception as exc:  # noqa: BLE001 - a failed export costs its batch, never the sidecar
            self._failed.inc(len(spans))
            quiet.log(logging.WARNING, "export", "trace export to %s failed (%d spans dropped): %s", self.url,
                      len(spans), describe(exc))
            return
        self._exported.inc(len(spans))


def _started_ns(decision: Decision) -> int:
    return int((decision.at - decision.total_s - _admission_wait_s(decision)) * 1e9)


def _admission_wait_s(decision: Decision) -> float:
    """The request's wait in the admission queue before its decision (0 when it was not held)."""
    return decision.admission_wait_s


def span_attributes(decision: Decision) -> dict[str, Any]:
    """What a decision's span carries (docs/operations.md, "Traces")."""
    chosen = decision.endpoint
    matched = next((c.matched_tokens for c in decision.candidates if c.endpoint == chosen), 0) if chosen else 0
    attributes: dict[str, Any] = {
        "loadaware.request_id": decision.request_id,
        "loadaware.policy": decision.policy,
        "loadaware.endpoint": chosen or "",
        "loadaware.ranked_count": len(decision.ranked),
        "loadaware.outcome": decision.outcome,
        "loadaware.reasons": list(decision.reasons),
        "loadaware.prompt_tokens": decision.prompt_tokens,
        "loadaware.matched_tokens": matched,
        "loadaware.pool_size": decision.pool_size,
        "loadaware.decide_s": decision.total_s,
        "loadaware.admission_wait_s": _admission_wait_s(decision),
        "loadaware.objective": decision.objective,
        "loadaware.priority": decision.priority,
        "loadaware.fairness_id": decision.fairness_id,
    }
    if decision.rule:
        attributes["loadaware.rule"] = decision.rule  # the policy's other rule chose, or "state" (a stored response)
    if decision.state:
        attributes["loadaware.state"] = decision.state  # how a stored response's holder was found
    if decision.served is not None and decision.served != chosen:
        attributes["loadaware.served"] = decision.served  # a retry walked the ranked list
    if decision.status is not None:
        attributes["http.response.status_code"] = decision.status
    return attributes


# ---- OTLP/HTTP JSON (the OTLP specification's JSON encoding of ExportTraceServiceRequest) ----

def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}  # int64 is a string in protobuf's JSON mapping
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    return {"stringValue": str(v)}


def _attribute(key: str, value: Any) -> dict[str, Any]:
    return {"key": key, "value": _value(value)}


def _span(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None  # a span the SDK recorded has one
    parent = span.parent
    out: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}", "spanId": f"{context.span_id:016x}", "name": span.name,
        "kind": _OTLP_KIND.get(span.kind, 0), "startTimeUnixNano": str(span.start_time or 0),
        "endTimeUnixNano": str(span.end_time or 0),
        "attributes": [_attribute(k, v) for k, v in (span.attributes or {}).items()],
        "flags": int(context.trace_flags) | _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote
                                                             else 0),
    }
    if parent is not None:
        out["parentSpanId"] = f"{parent.span_id:016x}"
    if context.trace_state:
        out["traceState"] = context.trace_state.to_header()
    if span.status.status_code is not StatusCode.UNSET:
        out["status"] = {"code": _OTLP_STATUS[span.status.status_code], "message": span.status.description or ""}
    return out


def encode(spans: Sequence[ReadableSpan], resource: list[dict[str, Any]]) -> bytes:
    """One export request's body: the spans under the sidecar's resource and scope."""
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": resource},
        "scopeSpans": [{"scope": {"name": SCOPE_NAME}, "spans": [_span(s) for s in spans]}],
    }]}, separators=(",", ":")).encode()
