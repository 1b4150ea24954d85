"""The ext_proc replies the sidecar sends, built and serialized once where they do not vary.

The gRPC method is registered with an identity serializer, so the stream writes these bytes as they are:
the hot path does no protobuf serialization (grpcio/asyncio per-message overhead is what the sidecar pays
per request; serializing the same reply again each time would add to it).
"""

from __future__ import annotations

from collections.abc import Callable

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2

Mode = processing_mode_pb2.ProcessingMode

# For requests we do not route: skip the body round trip entirely.
PASSTHROUGH_MODE = Mode(request_header_mode=Mode.SEND, response_header_mode=Mode.SKIP,
                        request_body_mode=Mode.NONE, response_body_mode=Mode.NONE,
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
        self.request_trailers_continue = pb.ProcessingResponse(
            request_trailers=pb.TrailersResponse()).SerializeToString()
        self.response_trailers_continue = pb.ProcessingResponse(
            response_trailers=pb.TrailersResponse()).SerializeToString()
        self._route_body: dict[str, bytes] = {}
        self._route_headers: dict[str, bytes] = {}

    def _set(self, endpoint: str) -> pb.HeaderMutation:
        return pb.HeaderMutation(set_headers=[base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=self.header, raw_value=endpoint.encode()),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)])

    def body_route(self, endpoint: str) -> bytes:
        """Body reply naming the endpoint; one cached byte string per endpoint."""
        return self._cached(self._route_body, endpoint, lambda m: pb.ProcessingResponse(
            request_body=pb.BodyResponse(response=pb.CommonResponse(header_mutation=m))))

    def headers_route(self, endpoint: str) -> bytes:
        """Headers reply naming the endpoint (a body-less POST is decided on its headers)."""
        return self._cached(self._route_headers, endpoint, lambda m: pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=m))))

    def _cached(self, cache: dict[str, bytes], endpoint: str,
                build: Callable[[pb.HeaderMutation], pb.ProcessingResponse]) -> bytes:
        cached = cache.get(endpoint)
        if cached is None:
            cached = build(self._set(endpoint)).SerializeToString()
            if len(cache) < 4096:  # bounded even if discovery churns through many endpoints
                cache[endpoint] = cached
        return cached

    @staticmethod
    def immediate_error(status: int, message: str, details: str) -> bytes:
        """A local reply. Envoy treats it like its own: the shipped config's local_reply_config wraps the
        plain message into the OpenAI error JSON, so it is sent as text here (JSON would be nested)."""
        return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=pb.HeaderMutation(set_headers=[base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key="content-type", raw_value=b"text/plain"))]),
            body=message.encode(), details=f"loadaware_{details}")).SerializeToString()
