"""What the ext_proc messages carry besides the body: request headers the sidecar needs, and the Endpoint
Picker Protocol's metadata (the proxy's subset hint, the endpoint that served). Pure reads of protobuf."""

from __future__ import annotations

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


def _text(h: Any, limit: int) -> str:
    """A header's value as text, whatever its bytes (Envoy sends raw_value; invalid UTF-8 is replaced)."""
    raw = h.raw_value
    if raw:
        return raw[:limit].decode("utf-8", "replace")
    value: str = h.value
    return value[:limit]


def headers_of(http_headers: Any) -> tuple[str, str, str]:
    """(:method, :path, x-request-id) from an HttpHeaders message. Any bytes decode; each value is bounded,
    and a request id with characters unfit for a log line is escaped. (Decoding inline: this runs on every
    request.)"""
    method = path = request_id = ""
    for h in http_headers.headers.headers:
        key = h.key
        if key[:1] == ":":
            if key == ":method":
                raw = h.raw_value
                method = raw[:16].decode("utf-8", "replace") if raw else h.value[:16]
            elif key == ":path":
                raw = h.raw_value
                path = raw[:MAX_PATH_CHARS].decode("utf-8", "replace") if raw else h.value[:MAX_PATH_CHARS]
        elif key == "x-request-id":
            request_id = _text(h, MAX_REQUEST_ID_CHARS)
            if not request_id.isprintable():  # a newline or an escape sequence would forge log lines
                request_id = request_id.encode("unicode_escape").decode("ascii")[:MAX_REQUEST_ID_CHARS]
    return method, path, request_id


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
