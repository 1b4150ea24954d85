"""The ext_proc replies the sidecar sends, built and serialized once where they do not vary.

The gRPC method is registered with an identity serializer, so the stream writes these bytes as they are:
the hot path does no protobuf serialization (grpcio/asyncio per-message overhead is what the sidecar pays
per request; serializing the same reply again each time would add to it).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import duration_pb2, struct_pb2

Mode = processing_mode_pb2.ProcessingMode

# The Endpoint Picker Protocol's dynamic-metadata namespace: the proxy's override_host reads the destination
# from it (before the header), and reports the endpoint that served under the same namespace.
LB_NAMESPACE = "envoy.lb"
ROUTE_CACHE_LIMIT = 4096  # an LRU: bounded whatever discovery churns through, the lists in use kept
# A pinned request's one endpoint, listed this many times: override_host hands each retry the next listed host
# without asking the route's retry predicate (measured, envoy/envoy-inference-pool.yaml), so every attempt the
# shipped routes make (3) goes to it; past the list, the proxy's fallback would pick a host that is not it.
PINNED_REPEATS = 4
# Re-emitted request bodies go back in pieces of at most this size (well under gRPC's 4 MiB message cap).
STREAMED_PIECE_BYTES = 64 * 1024

# For requests we do not route: skip the body round trip entirely.
PASSTHROUGH_MODE = Mode(request_header_mode=Mode.SEND, response_header_mode=Mode.SKIP,
                        request_body_mode=Mode.NONE, response_body_mode=Mode.NONE,
                        request_trailer_mode=Mode.SKIP, response_trailer_mode=Mode.SKIP)
# For the response of a request that may have stored state (a Responses request): its body, streamed through as it
# comes (never buffered, never held), so the sidecar reads the response's id and learns which engine holds it.
# Asked for in the response headers' reply (honoured with allow_mode_override, envoy/envoy.yaml); no other
# request's response body ever reaches the sidecar in the BUFFERED deployment.
READ_RESPONSE_BODY_MODE = Mode(request_header_mode=Mode.SEND, response_header_mode=Mode.SEND,
                               request_body_mode=Mode.BUFFERED, response_body_mode=Mode.STREAMED,
                               request_trailer_mode=Mode.SKIP, response_trailer_mode=Mode.SKIP)


class Replies:
    def __init__(self, destination_header: str) -> None:
        self.header = destination_header
        strip = pb.HeaderMutation(remove_headers=[destination_header])
        # Headers of a request we will route: continue, and make sure no client value survives.
        self.headers_continue = pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=strip))
        ).SerializeToString()
        self.headers_passthrough = pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=strip)),
            mode_override=PASSTHROUGH_MODE,
        ).SerializeToString()
        self.body_no_destination = pb.ProcessingResponse(
            request_body=pb.BodyResponse(response=pb.CommonResponse(header_mutation=strip))
        ).SerializeToString()
        self.response_headers_continue = pb.ProcessingResponse(
            response_headers=pb.HeadersResponse()).SerializeToString()
        self.response_body_continue = pb.ProcessingResponse(response_body=pb.BodyResponse()).SerializeToString()
        self.response_headers_read_body = pb.ProcessingResponse(
            response_headers=pb.HeadersResponse(), mode_override=READ_RESPONSE_BODY_MODE).SerializeToString()
        self.request_trailers_continue = pb.ProcessingResponse(
            request_trailers=pb.TrailersResponse()).SerializeToString()
        self.response_trailers_continue = pb.ProcessingResponse(
            response_trailers=pb.TrailersResponse()).SerializeToString()
        self._route_body: OrderedDict[tuple[tuple[str, ...], bool], bytes] = OrderedDict()
        self._route_headers: OrderedDict[tuple[tuple[str, ...], bool], bytes] = OrderedDict()

    def _set(self, value: str) -> pb.HeaderMutation:
        return pb.HeaderMutation(set_headers=[base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=self.header, raw_value=value.encode()),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)])

    def _metadata(self, value: str) -> struct_pb2.Struct:
        metadata = struct_pb2.Struct()
        metadata.get_or_create_struct(LB_NAMESPACE)[self.header] = value
        return metadata

    def body_route(self, ranked: tuple[str, ...], pinned: bool = False) -> bytes:
        """Body reply naming the ranked endpoints (header and `envoy.lb` metadata); cached per list. `pinned`: only
        the first can serve (Decision.pinned), so every attempt the proxy makes is sent to it."""
        return self._cached(self._route_body, ranked, pinned, lambda m, md: pb.ProcessingResponse(
            request_body=pb.BodyResponse(response=pb.CommonResponse(header_mutation=m)), dynamic_metadata=md))

    def headers_route(self, ranked: tuple[str, ...], pinned: bool = False) -> bytes:
        """Headers reply naming the ranked endpoints: a body-less POST, or any request in full-duplex mode."""
        return self._cached(self._route_headers, ranked, pinned, lambda m, md: pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=m)),
            dynamic_metadata=md))

    def _cached(self, cache: OrderedDict[tuple[tuple[str, ...], bool], bytes], ranked: tuple[str, ...],
                pinned: bool, build: Callable[[pb.HeaderMutation, struct_pb2.Struct], pb.ProcessingResponse]
                ) -> bytes:
        # An LRU: the ranked lists in use change with the fleet and its loads; a full cache keeps the recent ones.
        key = (ranked, pinned)
        cached = cache.get(key)
        if cached is not None:
            cache.move_to_end(key)
        else:
            # Pinned: a retry after the holder's 5xx or reset goes back to the holder, where the next host of the
            # proxy's own choice would answer 404 for a response it never held (Decision.pinned).
            value = ",".join(ranked[:1] * PINNED_REPEATS if pinned else ranked)
            cached = build(self._set(value), self._metadata(value)).SerializeToString()
            cache[key] = cached
            if len(cache) > ROUTE_CACHE_LIMIT:
                cache.popitem(last=False)
        return cached

    @staticmethod
    def request_body_pieces(body: bytes | bytearray, end_of_stream: bool) -> list[bytes]:
        """A held request body sent back as streamed body responses (full-duplex mode). The pieces are views
        of the held body: each byte is copied once, into its reply."""
        if not body:
            return [streamed_request_body(b"", end_of_stream)]
        view = memoryview(body)
        pieces = [view[i:i + STREAMED_PIECE_BYTES] for i in range(0, len(body), STREAMED_PIECE_BYTES)]
        return [streamed_request_body(p, end_of_stream and i == len(pieces) - 1) for i, p in enumerate(pieces)]

    @staticmethod
    def immediate_json(status: int, message: str, error_type: str, details: str, param: str | None = None,
                       headers: tuple[tuple[str, str], ...] = ()) -> bytes:
        """A local reply with an OpenAI-style JSON error body, for proxies (gateways) that send the picker's
        reply as it is."""
        body = json.dumps({"error": {"message": message, "type": error_type, "param": param, "code": status}})
        return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=_reply_headers("application/json", headers),
            body=body.encode(), details=f"loadaware_{details}")).SerializeToString()

    @staticmethod
    def immediate_error(status: int, message: str, details: str, headers: tuple[tuple[str, str], ...] = ()
                        ) -> bytes:
        """A local reply. Envoy treats it like its own: the shipped config's local_reply_config wraps the
        plain message into the OpenAI error JSON, so it is sent as text here (JSON would be nested)."""
        return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=_reply_headers("text/plain", headers),
            body=message.encode(), details=f"loadaware_{details}")).SerializeToString()

    @staticmethod
    def message_timeout(seconds: float) -> bytes:
        """Ask Envoy to restart the current message's timer at `seconds` (honoured up to the filter's
        max_message_timeout, once per message; past it Envoy ignores the request and the old timer runs)."""
        whole = int(seconds)
        return pb.ProcessingResponse(override_message_timeout=duration_pb2.Duration(
            seconds=whole, nanos=int((seconds - whole) * 1e9))).SerializeToString()


def _reply_headers(content_type: str, extra: tuple[tuple[str, str], ...]) -> pb.HeaderMutation:
    return pb.HeaderMutation(set_headers=[
        base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, raw_value=v.encode()))
        for k, v in (("content-type", content_type), *extra)])


# ---- streamed body mutations, encoded by hand: one per response chunk, so the least work per chunk ----
# ProcessingResponse{request_body=3 | response_body=4: BodyResponse{response=1: CommonResponse{body_mutation=3:
# BodyMutation{streamed_response=3: StreamedBodyResponse{body=1, end_of_stream=2}}}}}. A test checks the bytes
# against protobuf's own serialization.

def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _streamed(outer_tag: bytes, body: bytes | memoryview, end_of_stream: bool) -> bytes:
    # The nested messages' lengths first, then one join: the body's bytes are copied once, into the reply
    # (building each level by concatenation copied them once per level).
    n = len(body)
    field = b"\x0a" + _varint(n) if n else b""
    tail = b"\x10\x01" if end_of_stream else b""
    inner = len(field) + n + len(tail)
    inner_len = _varint(inner)
    mutation = 1 + len(inner_len) + inner
    mutation_len = _varint(mutation)
    common = 1 + len(mutation_len) + mutation
    common_len = _varint(common)
    response = 1 + len(common_len) + common
    return b"".join((outer_tag, _varint(response), b"\x0a", common_len, b"\x1a", mutation_len, b"\x1a", inner_len,
                     field, body, tail))


def streamed_request_body(body: bytes | memoryview, end_of_stream: bool) -> bytes:
    return _streamed(b"\x1a", body, end_of_stream)


def streamed_response_body(body: bytes, end_of_stream: bool) -> bytes:
    return _streamed(b"\x22", body, end_of_stream)


# ---- one header more on the upstream request, added to a reply that is already bytes ----

_REQUEST_HEADERS_TAG, _REQUEST_BODY_TAG = b"\x0a", b"\x1a"  # ProcessingResponse fields 1 and 3, length-delimited


def with_request_header(reply: bytes, key: str, value: str) -> bytes:
    """`reply` (a request headers or request body reply) setting one header more on the request Envoy sends
    upstream; any other reply (a local reply, ...) unchanged. The same field is appended again carrying only
    the header: a parser merges a message field that occurs twice (protobuf's encoding rules), so the cached
    reply's bytes are reused as they are and its header list gains one entry."""
    tag = reply[:1]
    if tag not in (_REQUEST_HEADERS_TAG, _REQUEST_BODY_TAG):
        return reply
    common = pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=[base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)]))
    extra = pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common)) \
        if tag == _REQUEST_HEADERS_TAG else pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
    return reply + extra.SerializeToString()
