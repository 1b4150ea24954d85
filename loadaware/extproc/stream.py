"""The ext_proc server: one gRPC stream is one HTTP request, in either processing mode, on one port.

The first message tells the mode: Envoy announces it in `protocol_config` (FULL_DUPLEX_STREAMED request
bodies: the gateway's InferencePool picker, extproc/duplex.py; anything else: BUFFERED, the sidecar
deployment's default, extproc/buffered.py). Whatever ends the stream (EOF, client abort, Envoy reset, a
failure, shutdown) announces `ended` on the request lifecycle: the in-flight count is released there.

The server knows the decider and the lifecycle, nothing below them (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf.message import DecodeError

from loadaware.admission.controller import AdmissionController
from loadaware.extproc.buffered import BufferedConversation
from loadaware.extproc.conversation import StreamOptions, StreamState, Write
from loadaware.extproc.duplex import DuplexConversation
from loadaware.extproc.replies import Replies
from loadaware.extproc.shielded import ShieldedReads, ShieldedWrites
from loadaware.extproc.stream_end import client_left, end_at_eof, reset_by_client
from loadaware.extproc.traced import Tracer, trace_unreplied, traced_writes
from loadaware.lifecycle import RequestLifecycle
from loadaware.routing.pipeline import Decider
from loadaware.telemetry.faults import RateLimitedLog, describe
from loadaware.telemetry.metrics import Metrics

log = logging.getLogger(__name__)
quiet = RateLimitedLog(log)  # a client can cause these at will: one line per kind per interval

SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"
METHOD = "Process"
FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


def is_full_duplex(first: Any) -> bool:
    return bool(first.HasField("protocol_config") and first.protocol_config.request_body_mode == FULL_DUPLEX)


def over_cap(open_streams: int, held: int, cap: int) -> bool:
    """Is a new stream (counted in `open_streams`) past `cap` (0: none)? The streams admission holds are left out:
    they have admission's own bounds, and a request of the top band must still reach admission while lower ones
    wait there, however many."""
    return cap > 0 and open_streams - held > cap


class ExtProcServicer:
    def __init__(self, decider: Decider, lifecycle: RequestLifecycle, metrics: Metrics,
                 destination_header: str, options: StreamOptions | None = None,
                 admission: AdmissionController | None = None) -> None:
        self.lifecycle = lifecycle
        self.metrics = metrics
        replies = Replies(destination_header)
        options = options or StreamOptions()
        self.buffered = BufferedConversation(decider, lifecycle, metrics, replies, options, admission)
        self.duplex = DuplexConversation(decider, lifecycle, metrics, replies, options, admission)
        self.open_streams = 0
        self.max_open_streams = options.max_open_streams
        self.admission = admission  # its held requests have their own bounds (count and bytes): not counted here
        self.modes = {"buffered": 0, "full_duplex": 0}  # streams seen per processing mode
        self.tracer: Tracer | None = None  # --otlp-endpoint: a span per decision (extproc/traced.py)

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.stream_stream_rpc_method_handler(
            self.process, request_deserializer=pb.ProcessingRequest.FromString,
            response_serializer=None)  # replies are pre-serialized bytes
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {METHOD: method})

    async def process(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        self.open_streams += 1
        stream = StreamState()
        end = "eof"
        try:
            await self._converse(context, stream)
            self.lifecycle.ended(stream.decision)  # the request is over: released before the wait for a reset
            await end_at_eof(context)  # a reset stream ends cancelled, sending no status (stream_end.py)
        except asyncio.CancelledError:
            # client abort, Envoy reset, or shutdown past its grace; after a complete response, Envoy's way
            # of ending a full-duplex stream
            end = "eof" if stream.response_done else "cancelled"
            raise
        except DecodeError as exc:  # a message that is not an ext_proc ProcessingRequest: not Envoy talking
            end = "malformed"
            quiet.log(logging.WARNING, "malformed", "ext_proc stream sent a malformed message: %s", describe(exc))
        except Exception as exc:  # noqa: BLE001 - a bug: the stream ends, the request is released, we say so
            end = "cancelled"  # unless the client is still there (and if the check is cancelled, it was gone)
            # a read or write whose call was gone: the client left, whatever gRPC says yet
            if client_left(exc) or await reset_by_client(context):
                log.debug("ext_proc stream ended by its client: %s", describe(exc))
                # ended cancelled, as end_at_eof does: a handler that returns makes grpc.aio send a status on
                # the gone call, a failed batch whose 80-byte op array it never frees (stream_end.py)
                raise asyncio.CancelledError from None
            end = "error"
            quiet.log(logging.ERROR, type(exc).__name__, "ext_proc stream failed: %s", describe(exc), exc_info=exc)
        finally:
            if self.tracer is not None:
                trace_unreplied(stream, self.tracer)
            # The decision lives on the stream, not in a local of _converse: a cancellation landing in any
            # await after the decision (a write, the wait for the end) must still end the request.
            self.lifecycle.ended(stream.decision)
            self.open_streams -= 1
            self.metrics.streams.labels(end).inc()

    def _over_cap(self, first: Any) -> bool:
        """A new request past --max-open-streams (this stream counted): refused before anything is kept for it.
        Only at its headers, where a local reply is always allowed."""
        held = len(self.admission.queue) if self.admission is not None else 0
        if not over_cap(self.open_streams, held, self.max_open_streams) or \
                first.WhichOneof("request") != "request_headers":
            return False
        self.metrics.decided("none", "overloaded")
        quiet.log(logging.WARNING, "overloaded", "%d ext_proc streams open (--max-open-streams %d): new requests "
                  "get 503", self.open_streams, self.max_open_streams)
        return True

    async def _converse(self, context: grpc.aio.ServicerContext, stream: StreamState) -> None:
        # Shielded: a read or write that the stream's cancellation interrupted would leak its gRPC batch
        # (shielded.py).
        read, writes = ShieldedReads(context.read), ShieldedWrites(context.write, gone=context.cancelled)
        write: Write = writes
        if self.tracer is not None:
            write = traced_writes(write, stream, self.tracer)
        try:
            first = await read()
            if first is grpc.aio.EOF:
                return
            if self._over_cap(first):
                await write((self.duplex if is_full_duplex(first) else self.buffered).overloaded())
                return
            if is_full_duplex(first):
                self.modes["full_duplex"] += 1
                await self.duplex.run(first, read, write, stream)
            else:
                self.modes["buffered"] += 1
                await self.buffered.run(first, read, write, stream)
        finally:
            read.close()
            writes.close()
