"""FULL_DUPLEX_STREAMED mode, as gateways configure an InferencePool's endpoint picker (request and response
headers SEND, bodies FULL_DUPLEX_STREAMED, trailers SEND).

Envoy sends body chunks as they arrive and takes replies whenever the picker sends them, in order:

request headers  -> inference POST with a body: held (a destination set after the body would be ignored)
                 -> anything else: decided on load now; headers reply with the destination
request body     -> accumulated to end of stream (or trailers), within --max-request-body-bytes (else 413);
                    parsed and decided once; then the headers reply (ranked destination as header and
                    `envoy.lb` metadata) and the body sent back unchanged as streamed mutations
request trailers -> decide if the body did not end the stream; trailers continue
response headers -> the status and the proxy's served-endpoint report: the request's outcome (failure-aware
                    routing) and its count moves if a retry walked the list
response body    -> every chunk straight back as a streamed mutation carrying the same bytes
response trailers-> continue
A request with nobody to route to gets a 503 (or, by setting, the proxy's own fallback). The stream lives
until the response ends, so the in-flight count still lives on the stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc

from loadaware.extproc.conversation import Conversation, Read, StreamState, Write, new_request_id, timed_parse
from loadaware.extproc.metadata import headers_of, subset_hint
from loadaware.extproc.replies import streamed_request_body, streamed_response_body
from loadaware.routing.request import STATE_KIND, inference_kind, state_request


@dataclass(slots=True)
class HeldRequest:
    """What the request's headers said, and its body while the headers reply waits for it."""

    held: bool = False  # the headers reply waits for the body
    kind: str | None = None
    request_id: str = ""
    subset: frozenset[str] | None = None
    # The held body's chunks, joined once when it ends (a growing bytearray re-copies what it holds each time
    # it outgrows its allocation).
    parts: list[bytes] = field(default_factory=list)
    size: int = 0


class DuplexConversation(Conversation):
    json_errors = True
    sees_every_response = True

    async def run(self, first: Any, read: Read, write: Write, stream: StreamState) -> None:
        replies = self.replies
        request = HeldRequest()
        msg: Any = first
        while msg is not grpc.aio.EOF:
            which = msg.WhichOneof("request")
            if which == "response_body":  # the hottest message: one per streamed token chunk, handled inline
                chunk = msg.response_body
                if stream.reader is not None:  # a Responses request's: the stored response's id names its holder
                    self.read_state(stream, chunk.body)  # before the client can see the id and follow up
                await write(streamed_response_body(chunk.body, chunk.end_of_stream))
                decision = stream.decision
                if decision is not None and not decision.first_chunk and chunk.body:
                    self.lifecycle.first_chunk(decision)  # the engine has prefilled: token signals
                if chunk.end_of_stream:
                    stream.response_done = True
            elif which == "request_headers":
                if not await self._request_headers(msg, request, stream, write):
                    return
            elif which == "request_body":
                if not await self._request_body(msg.request_body, request, stream, write):
                    return
            elif which == "request_trailers":
                # The trailers end the request: decide now, the body goes back before them.
                if request.held and not await self._route_held(request, stream, write, end_of_stream=False):
                    return
                await write(replies.request_trailers_continue)
            elif which == "response_headers":
                self.responded(stream, msg)
                await write(replies.response_headers_continue)
                stream.response_done = msg.response_headers.end_of_stream
            elif which == "response_trailers":
                await write(replies.response_trailers_continue)
                stream.response_done = True
            msg = None  # the message handled is not kept while the next one is awaited (an engine may take long)
            msg = await read()

    async def _request_headers(self, msg: Any, request: HeldRequest, stream: StreamState, write: Write) -> bool:
        """An inference POST with a body is held for it; anything else is decided now. False: answered locally."""
        stream.headers = head = headers_of(msg.request_headers, self.options.session_header)
        method, path = head.method, head.path
        request.request_id = head.request_id or new_request_id()
        request.subset = subset_hint(msg)
        request.kind = kind = inference_kind(method, path)
        if kind is not None and kind != STATE_KIND and not msg.request_headers.end_of_stream:
            request.held = True
            return True
        # Nothing to read in a body: decide on load alone (or a stored response's state) now.
        stream.decided = True
        decision = await self.decide(state_request(method, path), request.request_id, stream, subset=request.subset)
        reply = self.unroutable_reply(decision, picker=True)
        if reply is not None:
            await write(reply)
            return False
        await write(self.replies.headers_route(decision.ranked, decision.pinned) if decision.ranked
                    else self.replies.headers_continue)
        return True

    async def _request_body(self, part: Any, request: HeldRequest, stream: StreamState, write: Write) -> bool:
        """A body chunk: echoed once decided, else held (within --max-request-body-bytes) and, at the body's
        end, decided on. False: answered locally."""
        if not request.held:
            await write(streamed_request_body(part.body, part.end_of_stream))
            return True
        request.parts.append(part.body)
        request.size += len(part.body)
        if request.size > self.options.max_body_bytes:
            await write(self.rejected(413, "request_too_large", "request body is too large", request.request_id))
            return False
        if part.end_of_stream:
            return await self._route_held(request, stream, write, end_of_stream=True)
        return True

    async def _route_held(self, request: HeldRequest, stream: StreamState, write: Write, end_of_stream: bool) -> bool:
        request.held = False
        parts, request.parts = request.parts, []  # the request lives as long as the stream: not its body
        return await self._route(request.kind or "completions", b"".join(parts), request.request_id,
                                 request.subset, stream, write, end_of_stream=end_of_stream)

    async def _route(self, kind: str, body: bytes, request_id: str, subset: frozenset[str] | None,
                     stream: StreamState, write: Write, end_of_stream: bool) -> bool:
        """Decide on the whole body, then the headers reply and the body back. False: answered locally."""
        stream.decided = True
        parsed, parse_s = await timed_parse(self, kind, body, request_id)
        if isinstance(parsed, bytes):
            await write(parsed)
            return False
        # Held here while the pool is saturated (--admission): a picker's message timeout is the gateway's
        # (Istio: 1000 s), so no extension is asked for.
        verdict = None if self.admission is None else \
            await self.admit(len(body), request_id, stream, write, extend_timeout=False)
        if isinstance(verdict, bytes):
            await write(verdict)
            return False
        decision = await self.decide(parsed, request_id, stream, parse_s, subset, verdict=verdict)
        reply = self.unroutable_reply(decision, picker=True, model=parsed.model)
        if reply is not None:
            await write(reply)
            return False
        await write(self.replies.headers_route(decision.ranked, decision.pinned) if decision.ranked
                    else self.replies.headers_continue)
        for piece in self.replies.request_body_pieces(body, end_of_stream):
            await write(piece)
        return True
