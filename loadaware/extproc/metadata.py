"""What the ext_proc messages carry besides the body: request headers the sidecar needs, and the Endpoint
Picker Protocol's metadata (the proxy's subset hint, the endpoint that served). Pure reads of protobuf."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import struct_pb2

from loadaware.extproc.replies import LB_NAMESPACE

SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"


# Bounds on what a client controls (docs/architecture.md, "Input bounds"): a value past them is cut, never
# an error. Envoy caps a request's headers at 60 KiB; the sidecar's port may be reached without Envoy.
MAX_REQUEST_ID_CHARS = 256  # logged, kept in the recent ring and Explain: an id, not a payload
MAX_PATH_CHARS = 2048  # only compared with the two inference paths
MAX_SUBSET_ENDPOINTS = 16_384  # a subset hint naming more is cut to its first ones
MAX_ENDPOINT_CHARS = 300  # an ip:port (IPv6 with brackets and a zone included) is far shorter
MAX_LABEL_CHARS = 128  # an objective's or a fairness id's name, a session key: names, not payloads
MAX_TRACE_CHARS = 512  # traceparent is 55 characters; tracestate is at most 32 entries (W3C), cut here

# The Gateway API Inference Extension's request headers (the Endpoint Picker Protocol): the request's
# objective (its priority comes from the InferenceObjective of that name) and its fairness id.
OBJECTIVE_HEADER = "x-gateway-inference-objective"
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"


@dataclass(slots=True)
class RequestHeaders:
    """What the sidecar reads of a request's headers, each value bounded and printable where it is logged."""

    method: str = ""
    path: str = ""
    request_id: str = ""
    objective: str = ""
    fairness_id: str = ""
    traceparent: str = ""
    tracestate: str = ""
    session: str = ""  # the value of the header --session-header names ("" when unset or absent)


def _text(h: Any, limit: int) -> str:
    """A header's value as text, whatever its bytes (Envoy sends raw_value; invalid UTF-8 is replaced)."""
    raw = h.raw_value
    if raw:
        return raw[:limit].decode("utf-8", "replace")
    value: str = h.value
    return value[:limit]


def headers_of(http_headers: Any, session_header: str = "") -> RequestHeaders:
    """The request headers the sidecar reads, from an HttpHeaders message: `:method`, `:path`, x-request-id, the
    objective and fairness id, W3C trace context and (when `session_header` names one) the session key. Any
    bytes decode; each value is bounded, and a value with characters unfit for a log line is escaped.
    (Decoding inline: this runs on every request.)"""
    out = RequestHeaders()
    for h in http_headers.headers.headers:
        key = h.key
        if key[:1] == ":":
            if key == ":method":
                raw = h.raw_value
                out.method = raw[:16].decode("utf-8", "replace") if raw else h.value[:16]
            elif key == ":path":
                raw = h.raw_value
                out.path = raw[:MAX_PATH_CHARS].decode("utf-8", "replace") if raw else h.value[:MAX_PATH_CHARS]
        elif key == "x-request-id":
            out.request_id = _printable(_text(h, MAX_REQUEST_ID_CHARS), MAX_REQUEST_ID_CHARS)
        elif key[:10] == "x-gateway-":
            if key == OBJECTIVE_HEADER:
                out.objective = _printable(_text(h, MAX_LABEL_CHARS), MAX_LABEL_CHARS)
            elif key == FAIRNESS_HEADER:
                out.fairness_id = _printable(_text(h, MAX_LABEL_CHARS), MAX_LABEL_CHARS)
        elif key == "traceparent":
            out.traceparent = _text(h, MAX_TRACE_CHARS)
        elif key == "tracestate":
            out.tracestate = _text(h, MAX_TRACE_CHARS)
        if session_header and key == session_header:
            out.session = _printable(_text(h, MAX_LABEL_CHARS), MAX_LABEL_CHARS)
    return out


def _printable(value: str, limit: int) -> str:
    """`value`, escaped if it holds characters that would forge a log line (a newline, an escape sequence)."""
    if value.isprintable():
        return value
    return value.encode("unicode_escape").decode("ascii")[:limit]


def status_of(http_headers: Any) -> int | None:
    """The `:status` of a response's HttpHeaders message, or None if absent or garbled."""
    for h in http_headers.headers.headers:
        if h.key == ":status":
            value = _text(h, 8)
            # three ASCII digits, 100-599: isdigit alone admits other scripts' digits ("٥٠٠", "²"), which int()
            # may refuse, and a status past 599 would name a status class of its own in the metrics
            if len(value) == 3 and value.isascii() and value.isdigit() and "1" <= value[0] <= "5":
                return int(value)
            return None
    return None


def _namespace(msg: Any, name: str) -> struct_pb2.Struct | None:
    if not msg.HasField("metadata_context"):
        return None
    filter_metadata = msg.metadata_context.filter_metadata
    return filter_metadata.get(name)  # no entry is created for an absent namespace


def subset_hint(msg: Any) -> frozenset[str] | None:
    """The endpoints the proxy allows for this request (None: no hint, the whole fleet). A list of `ip:port`
    strings, or one comma-separated string; an empty or unreadable hint allows nothing."""
    namespace = _namespace(msg, SUBSET_NAMESPACE)
    if namespace is None or SUBSET_KEY not in namespace.fields:
        return None
    value = namespace.fields[SUBSET_KEY]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        items = [v.string_value for v in value.list_value.values[:MAX_SUBSET_ENDPOINTS]
                 if v.WhichOneof("kind") == "string_value"]
    elif kind == "string_value":
        items = value.string_value.split(",", MAX_SUBSET_ENDPOINTS)[:MAX_SUBSET_ENDPOINTS]
    else:
        items = []
    return frozenset(item.strip() for item in items if item.strip() and len(item) <= MAX_ENDPOINT_CHARS)


def served_endpoint(msg: Any) -> str | None:
    """The endpoint the proxy reports as having served the request (with the response headers)."""
    namespace = _namespace(msg, LB_NAMESPACE)
    if namespace is None or SERVED_KEY not in namespace.fields:
        return None
    value = namespace.fields[SERVED_KEY]
    if value.WhichOneof("kind") != "string_value":
        return None
    served = value.string_value.split(",", 1)[0].strip()
    return served if served and len(served) <= MAX_ENDPOINT_CHARS else None
