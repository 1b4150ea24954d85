"""Traces end to end in one process: a sidecar with --otlp-endpoint, spoken to over real gRPC in both ext_proc
modes, exporting to an OTLP/HTTP receiver run by the test on 127.0.0.1 that decodes every request as the OTLP
JSON encoding of ExportTraceServiceRequest. Checked: one span per decision, its parent the incoming
traceparent's span (same trace id), and the upstream request's traceparent (the ext_proc reply's header
mutation) naming the sidecar's span."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from aiohttp import web
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from loadaware.app import Sidecar
from loadaware.config import from_args
from loadaware.telemetry.tracing import parse_traceparent
from testkit.ports import free_port
from tests.conftest import wait_until_async

FLEET = "127.0.0.2:18000,127.0.0.3:18000"
HEADER = "x-gateway-destination-endpoint"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
HEX = set("0123456789abcdef")


class OtlpReceiver:
    """POST /v1/traces, OTLP JSON: each span decoded and checked against the encoding's rules as it arrives."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/json"
        body = json.loads(await request.read())
        self.requests += 1
        for resource_spans in body["resourceSpans"]:
            resource = _attributes(resource_spans["resource"]["attributes"])
            assert resource["service.name"] == "loadaware-sidecar"
            for scope_spans in resource_spans["scopeSpans"]:
                assert scope_spans["scope"]["name"] == "loadaware"
                for span in scope_spans["spans"]:
                    assert len(span["traceId"]) == 32 and set(span["traceId"]) <= HEX
                    assert len(span["spanId"]) == 16 and set(span["spanId"]) <= HEX
                    assert int(span["startTimeUnixNano"]) <= int(span["endTimeUnixNano"])
                    self.spans.append({**span, "attributes": _attributes(span["attributes"])})
        return web.json_response({})  # an ExportTraceServiceResponse with no partial success


def _attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP JSON KeyValues as plain values (int64 arrives as a string, per protobuf's JSON mapping)."""
    def value(v: dict[str, Any]) -> Any:
        (kind, x), = v.items()
        if kind == "intValue":
            return int(x)
        if kind == "arrayValue":
            return [value(i) for i in x.get("values", [])]
        return x
    return {item["key"]: value(item["value"]) for item in items}


@contextlib.asynccontextmanager
async def traced_sidecar(interval_s: float) -> AsyncIterator[tuple[Sidecar, str, OtlpReceiver]]:
    """A started sidecar exporting to a started receiver every `interval_s`; both stopped at the end."""
    receiver = OtlpReceiver()
    await receiver.start()
    port = free_port()
    app = Sidecar(from_args(["--listen", f"127.0.0.1:{port}", "--endpoints", FLEET, "--metrics-listen", "off",
                             "--admin-listen", "off", "--admin-http-listen", "off", "--policy", "leastload",
                             "--shutdown-grace-s", "1", "--otlp-endpoint", f"http://127.0.0.1:{receiver.port}"],
                            environ={}))
    assert app.tracing is not None
    app.tracing.interval_s = interval_s
    await app.start()
    try:
        yield app, f"127.0.0.1:{port}", receiver
    finally:
        await app.stop()
        await receiver.stop()


def request_headers(traceparent: str | None, duplex: bool = False) -> pb.ProcessingRequest:
    hs = [(":method", "POST"), (":path", "/v1/completions"), ("x-request-id", "traced-1" if traceparent else "root-1")]
    if traceparent is not None:
        hs.append(("traceparent", traceparent))
    msg = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs])))
    if duplex:
        mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
        msg.protocol_config.request_body_mode = mode
        msg.protocol_config.response_body_mode = mode
    return msg


def upstream_headers(mutation: pb.HeaderMutation) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


async def buffered_request(addr: str, traceparent: str | None) -> dict[str, str]:
    """A BUFFERED request (headers, body, the response's headers) to its end; what its body reply sets upstream."""
    async with grpc.aio.insecure_channel(addr) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(request_headers(traceparent))
        await call.read()
        await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=b'{"prompt": "hello"}',
                                                                       end_of_stream=True)))
        reply = await call.read()
        await call.write(pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=":status", raw_value=b"200")]))))
        await call.read()
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
        return upstream_headers(reply.request_body.response.header_mutation)


async def duplex_request(addr: str, traceparent: str | None) -> dict[str, str]:
    """A full-duplex (picker) request: headers held, the body decides; what the headers reply sets upstream."""
    async with grpc.aio.insecure_channel(addr) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(request_headers(traceparent, duplex=True))
        await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=b'{"prompt": "hi"}', end_of_stream=True)))
        reply = await call.read()
        assert reply.WhichOneof("response") == "request_headers"
        await call.read()  # the body, streamed back
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
        return upstream_headers(reply.request_headers.response.header_mutation)


async def test_one_span_per_decision_parented_and_propagated() -> None:
    async with traced_sidecar(0.05) as (app, addr, receiver):
        await _one_span_per_decision(app, addr, receiver)


async def _one_span_per_decision(app: Sidecar, addr: str, receiver: OtlpReceiver) -> None:
    incoming = f"00-{TRACE}-{PARENT}-01"
    sent = {"buffered": await buffered_request(addr, incoming), "duplex": await duplex_request(addr, incoming),
            "root": await buffered_request(addr, None)}
    await wait_until_async(lambda: len(receiver.spans) >= 3, message=lambda: f"spans received: {receiver.spans}")
    assert len(receiver.spans) == 3  # one per decision, no more
    by_span = {s["spanId"]: s for s in receiver.spans}
    for name, upstream in sent.items():
        assert upstream[HEADER].split(",")[0] in FLEET.split(",")
        own = parse_traceparent(upstream["traceparent"])
        assert own is not None and own.sampled, name
        span = by_span[f"{own.span_id:016x}"]  # the upstream request names the sidecar's span
        assert span["name"] == "loadaware.route" and span["kind"] == 2
        assert span["traceId"] == f"{own.trace_id:032x}"
        attributes = span["attributes"]
        assert attributes["loadaware.endpoint"] == upstream[HEADER].split(",")[0]
        assert attributes["loadaware.ranked_count"] == len(upstream[HEADER].split(","))
        assert attributes["loadaware.outcome"] == "routed" and attributes["loadaware.policy"] == "leastload"
        assert attributes["loadaware.pool_size"] == 2
        if name == "root":  # no traceparent: a new trace, the span its root
            assert span["traceId"] != TRACE and "parentSpanId" not in span
            assert attributes["loadaware.request_id"] == "root-1"
        else:  # the caller's trace, the caller's span the parent
            assert span["traceId"] == TRACE and span["parentSpanId"] == PARENT
            assert attributes["loadaware.request_id"] == "traced-1"
    assert by_span[f"{parse_traceparent(sent['buffered']['traceparent']).span_id:016x}"][  # type: ignore[union-attr]
        "attributes"]["http.response.status_code"] == 200
    registry = app.metrics.registry
    assert registry.get_sample_value("loadaware_trace_spans_total", {"result": "exported"}) == 3


async def test_spans_queued_at_stop_are_exported() -> None:
    async with traced_sidecar(3600.0) as (app, addr, receiver):  # the periodic export sleeps through the test
        await buffered_request(addr, f"00-{TRACE}-{PARENT}-01")
        tracing = app.tracing
        assert tracing is not None
        await wait_until_async(lambda: len(tracing.queue.spans) == 1, message="the span queued when its stream ended")
        assert not receiver.spans
        await app.stop()  # drains the streams, then the last export
        assert len(receiver.spans) == 1 and receiver.spans[0]["parentSpanId"] == PARENT
