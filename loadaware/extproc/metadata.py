"""What the ext_proc messages carry besides the body: request headers the sidecar needs, and the Endpoint
Picker Protocol's metadata (the proxy's subset hint, the endpoint that served). Pure reads of protobuf."""

from __future__ import annotations

from typing import Any

from google.protobuf import struct_pb2

from loadaware.extproc.replies import LB_NAMESPACE

SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"


def headers_of(http_headers: Any) -> tuple[str, str, str]:
    """(:method, :path, x-request-id) from an HttpHeaders message (Envoy sends raw_value)."""
    method = path = request_id = ""
    for h in http_headers.headers.headers:
        key = h.key
        if key[0] == ":":
            if key == ":method":
                method = h.raw_value.decode() if h.raw_value else h.value
            elif key == ":path":
                path = h.raw_value.decode() if h.raw_value else h.value
        elif key == "x-request-id":
            request_id = h.raw_value.decode() if h.raw_value else h.value
    return method, path, request_id


def status_of(http_headers: Any) -> int | None:
    """The `:status` of a response's HttpHeaders message, or None if absent or garbled."""
    for h in http_headers.headers.headers:
        if h.key == ":status":
            value = h.raw_value.decode() if h.raw_value else h.value
            return int(value) if value.isdigit() else None
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
        items = [v.string_value for v in value.list_value.values if v.WhichOneof("kind") == "string_value"]
    elif kind == "string_value":
        items = value.string_value.split(",")
    else:
        items = []
    return frozenset(item.strip() for item in items if item.strip())


def served_endpoint(msg: Any) -> str | None:
    """The endpoint the proxy reports as having served the request (with the response headers)."""
    namespace = _namespace(msg, LB_NAMESPACE)
    if namespace is None or SERVED_KEY not in namespace.fields:
        return None
    value = namespace.fields[SERVED_KEY]
    if value.WhichOneof("kind") != "string_value":
        return None
    return value.string_value.split(",", 1)[0].strip() or None
