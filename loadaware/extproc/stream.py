"""The ext_proc stream state machine: one gRPC stream is one HTTP request.

headers -> (inference POST) continue, stripped of any client destination header
        -> (anything else)   continue with a mode override that skips the body: pass-through
body    -> decide, reply with the destination header (or none: Envoy's fallback picks)
then    -> wait for the stream to end, which in BUFFERED mode is when the HTTP request finishes (Envoy
           keeps the stream open until the downstream request is done), and announce `ended` on the
           request lifecycle however it ended: the in-flight count is released there.

The server knows the decider and the lifecycle, nothing below them (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from loadaware.extproc.replies import Replies
from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.routing.pipeline import Decider
from loadaware.routing.request import BadRequest, inference_kind, parse_body
from loadaware.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"
METHOD = "Process"


def _headers_of(http_headers: Any) -> tuple[str, str, str]:
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


class ExtProcServicer:
    def __init__(self, decider: Decider, lifecycle: RequestLifecycle, metrics: Metrics,
                 destination_header: str) -> None:
        self.decider = decider
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.replies = Replies(destination_header)
        self.open_streams = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._rejections: dict[str, bytes] = {}

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.stream_stream_rpc_method_handler(
            self.process, request_deserializer=pb.ProcessingRequest.FromString,
            response_serializer=None)  # replies are pre-serialized bytes
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {METHOD: method})

    async def wait_idle(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    async def process(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        self.open_streams += 1
        self._idle.clear()
        stream = StreamState()
        end = "eof"
        try:
            await self._converse(context, stream)
        except asyncio.CancelledError:
            end = "cancelled"  # client abort, Envoy reset, or shutdown past its grace
            raise
        except Exception:
            end = "error"
            log.exception("ext_proc stream failed")
        finally:
            # The decision lives on the stream, not in a local of _converse: a cancellation landing in any
            # await after the decision (a write, the wait for the end) must still end the request.
            self.lifecycle.ended(stream.decision)
            self.open_streams -= 1
            if self.open_streams == 0:
                self._idle.set()
            self.metrics.streams.labels(end).inc()

    async def _converse(self, context: grpc.aio.ServicerContext, stream: StreamState) -> None:
        read, write = context.read, context.write
        replies = self.replies
        kind: str | None = None
        request_id = ""
        while True:
            msg = await read()
            if msg is grpc.aio.EOF:
                return
            which = msg.WhichOneof("request")
            if which == "request_headers":
                method, path, request_id = _headers_of(msg.request_headers)
                kind = inference_kind(method, path)
                if kind is None:
                    await write(replies.headers_passthrough)
                    self.metrics.decided("none", "passthrough")
                elif msg.request_headers.end_of_stream:
                    # A POST without a body: nothing to score, decide on load alone now.
                    decision = await self.decider.decide(None, request_id or _new_id())
                    stream.decision = decision
                    await write(replies.headers_route(decision.endpoint) if decision.endpoint
                                else replies.headers_continue)
                else:
                    await write(replies.headers_continue)
            elif which == "request_body":
                if kind is None or stream.decided:
                    await write(replies.body_no_destination)
                    continue
                stream.decided = True
                reply = await self._decide_body(kind, msg.request_body.body, request_id or _new_id(), stream)
                await write(reply)
            elif which == "response_headers":
                await write(replies.response_headers_continue)
            elif which == "response_body":
                await write(replies.response_body_continue)
            elif which == "request_trailers":
                await write(replies.request_trailers_continue)
            elif which == "response_trailers":
                await write(replies.response_trailers_continue)

    async def _decide_body(self, kind: str, body: bytes, request_id: str, stream: StreamState) -> bytes:
        t = time.perf_counter()
        try:
            request = parse_body(kind, body)
        except BadRequest as exc:
            self.metrics.decided("none", "rejected")
            self.metrics.fallback(exc.reason)
            log.info("request_id=%s rejected: %s", request_id, exc.message)
            reply = self._rejections.get(exc.reason)
            if reply is None:
                reply = self._rejections[exc.reason] = Replies.immediate_error(400, exc.message, exc.reason)
            return reply
        decision = await self.decider.decide(request, request_id, parse_s=time.perf_counter() - t)
        stream.decision = decision  # no await between the count and recording it on the stream
        if decision.endpoint is None:
            return self.replies.body_no_destination
        return self.replies.body_route(decision.endpoint)


class StreamState:
    """Per-stream state: the request's decision, once made. Shared fleet state lives behind the decider."""

    __slots__ = ("decided", "decision")

    def __init__(self) -> None:
        self.decision: Decision | None = None
        self.decided = False


def _new_id() -> str:
    return uuid.uuid4().hex
