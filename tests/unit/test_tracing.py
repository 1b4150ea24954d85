"""Traces: W3C traceparent parsing (hostile input), the decision's span (attributes, parenting, times), sampling,
the bounded export queue, the OTLP JSON body, the upstream traceparent added to a cached reply, and the stream's
traced writes failing open."""

from __future__ import annotations

import json
from typing import Any

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry

from loadaware.extproc.conversation import StreamState
from loadaware.extproc.metadata import RequestHeaders
from loadaware.extproc.replies import Replies, with_request_header
from loadaware.extproc.traced import trace_unreplied, traced_writes
from loadaware.lifecycle import Decision
from loadaware.policies.base import Candidate
from loadaware.telemetry.tracing import (
    TraceParent,
    Tracing,
    encode,
    format_traceparent,
    parse_traceparent,
    span_attributes,
    traces_url,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
SAMPLED = f"00-{TRACE}-{PARENT}-01"
UNSAMPLED = f"00-{TRACE}-{PARENT}-00"


# ---- traceparent ----

def test_parse_valid_traceparent() -> None:
    assert parse_traceparent(SAMPLED) == TraceParent(int(TRACE, 16), int(PARENT, 16), 1)
    assert parse_traceparent(SAMPLED).sampled  # type: ignore[union-attr]
    assert not parse_traceparent(UNSAMPLED).sampled  # type: ignore[union-attr]
    assert parse_traceparent(f" {SAMPLED}\t") is not None  # optional whitespace around a header value
    assert parse_traceparent(f"00-{TRACE}-{PARENT}-ff") == TraceParent(int(TRACE, 16), int(PARENT, 16), 0xFF)


def test_later_versions_read_as_version_00() -> None:
    assert parse_traceparent(f"01-{TRACE}-{PARENT}-01") is not None
    assert parse_traceparent(f"cc-{TRACE}-{PARENT}-01-what-the-future-adds") is not None
    assert parse_traceparent(f"cc-{TRACE}-{PARENT}-01x") is None  # more, but not after a '-'


@pytest.mark.parametrize("value", [
    "", "00", "garbage", "-" * 55, " " * 55,
    f"00-{TRACE}-{PARENT}-01-extra",  # version 00 is exactly 55 characters
    f"00-{TRACE}-{PARENT}-1",
    f"ff-{TRACE}-{PARENT}-01",  # version ff is invalid
    f"0g-{TRACE}-{PARENT}-01",
    f"00-{'0' * 32}-{PARENT}-01",  # all-zero trace id
    f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
    f"00-{TRACE.upper()}-{PARENT}-01",  # upper case
    f"00-{TRACE}-{PARENT.upper()}-01",
    f"00-{TRACE}-{PARENT}-0G",
    f"00_{TRACE}-{PARENT}-01", f"00-{TRACE}_{PARENT}-01", f"00-{TRACE}-{PARENT}_01",
    f"00-{TRACE[:-1]}x-{PARENT}-01",
    f"00-{TRACE[:-1]}٥-{PARENT}-01",  # another script's digit: int() would take it
    f"00-{TRACE}-{PARENT[:-1]}\n-01",  # a forged line
    f"00-{TRACE}-{PARENT}-0\x00",
    f"00-+{TRACE[1:]}-{PARENT}-01",  # int() takes a sign
    f"00-{TRACE[:-2]} 1-{PARENT}-01",
    "00-" + "f" * 600,
    "\ufffd" * 55,
])
def test_hostile_traceparents_are_refused(value: str) -> None:
    assert parse_traceparent(value) is None


def test_format_traceparent() -> None:
    assert format_traceparent(int(TRACE, 16), int(PARENT, 16), 1) == SAMPLED
    assert format_traceparent(1, 2, 0) == f"00-{1:032x}-{2:016x}-00"


def test_traces_url() -> None:
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"


# ---- the span ----

def decision(**kw: Any) -> Decision:
    d = Decision("req-1", "10.0.0.2:8000", "routed", ("prefix_error",), 1200,
                 (Candidate("10.0.0.2:8000", 1024, 1.0), Candidate("10.0.0.3:8000", 0, 0.0)), (0.8, 0.0),
                 {"tokenize": 0.001, "lookup": 0.0005, "score": 0.0001}, 0.002, at=1_700_000_000.5,
                 ranked=("10.0.0.2:8000", "10.0.0.3:8000"), pool_size=2, policy="lane-spread",
                 objective="chat", fairness_id="tenant-a", priority=2)
    for k, v in kw.items():
        setattr(d, k, v)
    return d


def tracing(ratio: float = 1.0, **kw: Any) -> Tracing:
    return Tracing("http://127.0.0.1:4318", ratio, CollectorRegistry(), **kw)


def test_span_is_a_child_of_the_incoming_traceparent() -> None:
    t, d = tracing(), decision(admission_wait_s=0.25, status=200)
    upstream = t.begin(d, SAMPLED)
    own = parse_traceparent(upstream)
    assert own is not None and own.trace_id == int(TRACE, 16) and own.span_id != int(PARENT, 16) and own.sampled
    assert not t.queue.spans  # queued only when the request ends
    t.on_ended(d)
    assert d.trace is None
    [span] = t.queue.spans
    assert span.name == "loadaware.route"
    assert span.context.trace_id == own.trace_id and span.context.span_id == own.span_id
    assert span.parent is not None and span.parent.span_id == int(PARENT, 16) and span.parent.is_remote
    # from when the sidecar took the request (its admission wait and the decision) to the decision
    assert span.end_time == int(d.at * 1e9)
    assert span.start_time == int((d.at - 0.002 - 0.25) * 1e9)
    assert dict(span.attributes or {}) == {
        "loadaware.request_id": "req-1", "loadaware.policy": "lane-spread", "loadaware.endpoint": "10.0.0.2:8000",
        "loadaware.ranked_count": 2, "loadaware.outcome": "routed", "loadaware.reasons": ("prefix_error",),
        "loadaware.prompt_tokens": 1200, "loadaware.matched_tokens": 1024, "loadaware.pool_size": 2,
        "loadaware.decide_s": 0.002, "loadaware.admission_wait_s": 0.25, "loadaware.objective": "chat",
        "loadaware.priority": 2, "loadaware.fairness_id": "tenant-a", "http.response.status_code": 200}


def test_no_or_bad_traceparent_starts_a_trace() -> None:
    t = tracing()
    seen = set()
    for incoming in ("", "00-garbage", f"00-{'0' * 32}-{PARENT}-01"):
        d = decision()
        own = parse_traceparent(t.begin(d, incoming))
        assert own is not None and own.sampled and own.trace_id not in (0, int(TRACE, 16))
        seen.add(own.trace_id)
        t.on_ended(d)
    assert len(seen) == 3
    assert all(span.parent is None for span in t.queue.spans)


def test_attributes_of_a_decision_without_an_endpoint_and_of_a_retry() -> None:
    a = span_attributes(decision(endpoint=None, served=None, ranked=(), outcome="no_endpoints", candidates=()))
    assert a["loadaware.endpoint"] == "" and a["loadaware.matched_tokens"] == 0 and a["loadaware.ranked_count"] == 0
    assert "http.response.status_code" not in a and "loadaware.served" not in a
    retried = decision()
    retried.served = "10.0.0.3:8000"
    assert span_attributes(retried)["loadaware.served"] == "10.0.0.3:8000"
    assert span_attributes(decision())["loadaware.admission_wait_s"] == 0.0
    assert "loadaware.rule" not in span_attributes(decision())  # the policy's usual rule chose
    assert span_attributes(decision(rule="all_queueing"))["loadaware.rule"] == "all_queueing"
    stateful = span_attributes(decision(rule="state", state="probed"))  # a stored response's holder placed it
    assert stateful["loadaware.rule"] == "state" and stateful["loadaware.state"] == "probed"
    assert "loadaware.state" not in span_attributes(decision())


# ---- sampling: parent-based, the ratio for new traces ----

def test_ratio_zero_samples_no_new_trace_but_a_sampled_parent_is_traced() -> None:
    t = tracing(ratio=0.0)
    d = decision()
    own = parse_traceparent(t.begin(d, ""))
    assert own is not None and not own.sampled  # still a span id and the header: downstream knows
    t.on_ended(d)
    assert not t.queue.spans
    d = decision()
    own = parse_traceparent(t.begin(d, SAMPLED))
    assert own is not None and own.sampled
    t.on_ended(d)
    assert len(t.queue.spans) == 1


def test_an_unsampled_parent_is_never_traced() -> None:
    t = tracing(ratio=1.0)
    d = decision()
    own = parse_traceparent(t.begin(d, UNSAMPLED))
    assert own is not None and own.trace_id == int(TRACE, 16) and not own.sampled
    t.on_ended(d)
    assert not t.queue.spans


def test_ratio_samples_about_its_share_of_new_traces() -> None:
    t = tracing(ratio=0.25)
    sampled = 0
    for _ in range(2000):
        d = decision()
        sampled += parse_traceparent(t.begin(d, "")).sampled  # type: ignore[union-attr]
        t.on_ended(d)
    assert 350 < sampled < 650 and len(t.queue.spans) == sampled


# ---- the export queue and its body ----

def test_full_queue_drops_and_counts() -> None:
    registry = CollectorRegistry()
    t = Tracing("http://127.0.0.1:4318", 1.0, registry, queue_limit=3)
    for _ in range(5):
        d = decision()
        t.begin(d, SAMPLED)
        t.on_ended(d)
    assert len(t.queue.spans) == 3
    assert registry.get_sample_value("loadaware_trace_spans_total", {"result": "dropped"}) == 2
    assert len(t.queue.take(2)) == 2 and len(t.queue.spans) == 1


def test_otlp_json_body() -> None:
    t = tracing()
    d = decision(status=503)
    own = parse_traceparent(t.begin(d, SAMPLED))
    t.on_ended(d)
    body = json.loads(encode(list(t.queue.spans), t._resource))
    [resource_spans] = body["resourceSpans"]
    resource = {a["key"]: a["value"] for a in resource_spans["resource"]["attributes"]}
    assert resource["service.name"] == {"stringValue": "loadaware-sidecar"}
    [scope] = resource_spans["scopeSpans"]
    assert scope["scope"]["name"] == "loadaware"
    [span] = scope["spans"]
    assert own is not None
    assert span["traceId"] == TRACE and span["spanId"] == f"{own.span_id:016x}" and span["parentSpanId"] == PARENT
    assert span["name"] == "loadaware.route" and span["kind"] == 2  # SPAN_KIND_SERVER
    assert span["endTimeUnixNano"] == str(int(d.at * 1e9)) and int(span["startTimeUnixNano"]) < int(d.at * 1e9)
    assert span["flags"] == 0x301  # sampled; the parent is known to be remote
    attributes = {a["key"]: a["value"] for a in span["attributes"]}
    assert attributes["loadaware.prompt_tokens"] == {"intValue": "1200"}
    assert attributes["loadaware.decide_s"] == {"doubleValue": 0.002}
    assert attributes["loadaware.endpoint"] == {"stringValue": "10.0.0.2:8000"}
    assert attributes["loadaware.reasons"] == {"arrayValue": {"values": [{"stringValue": "prefix_error"}]}}
    assert attributes["http.response.status_code"] == {"intValue": "503"}
    assert "status" not in span


async def test_failed_export_is_counted_and_never_raises() -> None:
    import aiohttp

    from testkit.ports import free_port

    registry = CollectorRegistry()
    t = Tracing(f"http://127.0.0.1:{free_port()}", 1.0, registry, timeout_s=2.0)  # nobody listens there
    for _ in range(3):
        d = decision()
        t.begin(d, "")
        t.on_ended(d)
    async with aiohttp.ClientSession() as session:
        await t.export_queued(session)
    assert not t.queue.spans
    assert registry.get_sample_value("loadaware_trace_spans_total", {"result": "failed"}) == 3
    await t.close()  # nothing left: returns at once


# ---- the upstream traceparent on the cached reply ----

def set_headers(reply: bytes) -> dict[str, str]:
    msg = pb.ProcessingResponse.FromString(reply)
    which = msg.WhichOneof("response")
    common = getattr(msg, which).response if which in ("request_headers", "request_body") else None
    if common is None:
        return {}
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def test_with_request_header_keeps_the_cached_reply_and_adds_the_header() -> None:
    replies = Replies("x-gateway-destination-endpoint")
    ranked = ("10.0.0.2:8000", "10.0.0.3:8000")
    for cached in (replies.body_route(ranked), replies.headers_route(ranked)):
        traced = with_request_header(cached, "traceparent", SAMPLED)
        assert traced.startswith(cached)
        assert set_headers(traced) == {"x-gateway-destination-endpoint": ",".join(ranked), "traceparent": SAMPLED}
        msg = pb.ProcessingResponse.FromString(traced)
        assert msg.dynamic_metadata.fields["envoy.lb"].struct_value.fields[
            "x-gateway-destination-endpoint"].string_value == ",".join(ranked)
    assert replies.body_route(ranked) == cached or replies.headers_route(ranked) == cached  # the cache untouched
    for other in (replies.body_no_destination, replies.headers_continue):
        msg = pb.ProcessingResponse.FromString(with_request_header(other, "traceparent", SAMPLED))
        which = msg.WhichOneof("response")
        mutation = getattr(msg, which).response.header_mutation
        assert list(mutation.remove_headers) == ["x-gateway-destination-endpoint"]
        assert [h.header.key for h in mutation.set_headers] == ["traceparent"]
    local = Replies.immediate_error(503, "no ready endpoint", "no_endpoints")
    assert with_request_header(local, "traceparent", SAMPLED) == local  # nothing goes upstream


# ---- the stream's writes ----

class Recorder:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    async def write(self, reply: bytes) -> None:
        self.written.append(reply)


async def test_traced_writes_add_the_header_to_the_decisions_reply_only() -> None:
    t, out, stream = tracing(), Recorder(), StreamState()
    stream.headers = RequestHeaders(method="POST", path="/v1/completions", traceparent=SAMPLED)
    replies = Replies("x-gateway-destination-endpoint")
    write = traced_writes(out.write, stream, t)
    await write(replies.headers_continue)  # before the decision: as it is
    stream.decision = d = decision()
    await write(replies.body_route(d.ranked))
    await write(replies.response_headers_continue)
    assert out.written[0] == replies.headers_continue and out.written[2] == replies.response_headers_continue
    upstream = parse_traceparent(set_headers(out.written[1])["traceparent"])
    assert upstream is not None and upstream.trace_id == int(TRACE, 16)
    assert d.trace is not None and d.trace.get_span_context().span_id == upstream.span_id
    trace_unreplied(stream, t)  # replied already: nothing more
    t.on_ended(d)
    assert len(t.queue.spans) == 1


async def test_a_failing_tracer_leaves_the_reply_as_it_was() -> None:
    class Broken:
        def begin(self, decision: Decision, traceparent: str) -> str:
            raise RuntimeError("boom")

    out, stream = Recorder(), StreamState()
    stream.decision = d = decision()
    reply = Replies("x-gateway-destination-endpoint").body_route(d.ranked)
    await traced_writes(out.write, stream, Broken())(reply)
    assert out.written == [reply]
    trace_unreplied(stream, Broken())  # nothing escapes


def test_a_decision_never_replied_to_still_gets_its_span() -> None:
    t, stream = tracing(), StreamState()
    stream.headers = RequestHeaders(traceparent=SAMPLED)
    stream.decision = d = decision()
    trace_unreplied(stream, t)
    t.on_ended(d)
    [span] = t.queue.spans
    assert span.parent is not None and span.parent.span_id == int(PARENT, 16)
