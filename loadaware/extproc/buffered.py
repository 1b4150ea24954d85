"""BUFFERED mode, the sidecar deployment's default (envoy/envoy.yaml): one message per request side.

headers -> (inference POST) continue, stripped of any client destination header
        -> (anything else)   continue with a mode override that skips the body: pass-through
body    -> (with --admission, while the pool is saturated: held, Envoy's message timer extended to cover the
           hold; or shed with a 429) decide, reply with the ranked destination (header and `envoy.lb`
           metadata), or none: Envoy's fallback picks
response headers -> the status and the engine that served (override_host's `selected_host_key`): the
           request's outcome, for failure-aware routing; continue (a Responses request's 200: with a mode
           override that streams its body by, to read the stored response's id)
a stored response's own path (GET /v1/responses/{id}, its cancel): placed at the headers on its holder
then    -> nothing until the stream ends: Envoy keeps it open until the HTTP request finishes.
"""

from __future__ import annotations

from typing import Any

import grpc

from loadaware.extproc.conversation import Conversation, Read, StreamState, Write, new_request_id, timed_parse
from loadaware.extproc.metadata import headers_of
from loadaware.routing.request import STATE_KIND, inference_kind, state_request


class BufferedConversation(Conversation):
    async def run(self, first: Any, read: Read, write: Write, stream: StreamState) -> None:
        replies = self.replies
        kind: str | None = None
        request_id = ""
        msg: Any = first
        while msg is not grpc.aio.EOF:
            which = msg.WhichOneof("request")
            if which == "request_headers":
                stream.headers = head = headers_of(msg.request_headers, self.options.session_header)
                method, path, request_id = head.method, head.path, head.request_id
                kind = inference_kind(method, path)
                if kind is None:
                    await write(replies.headers_passthrough)
                    self.metrics.decided("none", "passthrough")
                elif kind == STATE_KIND or msg.request_headers.end_of_stream:
                    # A POST without a body: nothing to score, decide on load alone now; a stored response's
                    # own path: placed by its state now. A body sent anyway finds the stream decided.
                    stream.decided = True
                    decision = await self.decide(state_request(method, path), request_id or new_request_id(),
                                                 stream)
                    await write(self.unroutable_reply(decision, picker=False)
                                or (replies.headers_route(decision.ranked, decision.pinned) if decision.ranked
                                    else replies.headers_continue))
                else:
                    await write(replies.headers_continue)
            elif which == "request_body":
                if kind is None or stream.decided:
                    await write(replies.body_no_destination)
                else:
                    stream.decided = True
                    await write(await self._decide_body(kind, msg.request_body.body,
                                                        request_id or new_request_id(), stream, write))
            elif which == "response_headers":  # envoy.yaml asks for them: the request's outcome
                self.responded(stream, msg)
                # A response that may name stored state: its body streams by the sidecar to read its id.
                await write(replies.response_headers_continue if stream.reader is None
                            else replies.response_headers_read_body)
            elif which == "response_body":  # only a response whose id is sought
                self.read_state(stream, msg.response_body.body)
                await write(replies.response_body_continue)
            elif which == "request_trailers":
                await write(replies.request_trailers_continue)
            elif which == "response_trailers":
                await write(replies.response_trailers_continue)
            # The message handled (a request's whole body) is not kept while the next one is awaited: that
            # wait lasts until the engine answers, and every request in flight would hold its body meanwhile.
            msg = None
            msg = await read()

    async def _decide_body(self, kind: str, body: bytes, request_id: str, stream: StreamState, write: Write
                           ) -> bytes:
        parsed, parse_s = await timed_parse(self, kind, body, request_id)
        if isinstance(parsed, bytes):
            return parsed
        verdict = None if self.admission is None else \
            await self.admit(len(body), request_id, stream, write, extend_timeout=True)
        if isinstance(verdict, bytes):
            return verdict
        decision = await self.decide(parsed, request_id, stream, parse_s, verdict=verdict)
        unroutable = self.unroutable_reply(decision, picker=False, model=parsed.model)
        if unroutable is not None:
            return unroutable
        if not decision.ranked:
            return self.replies.body_no_destination
        return self.replies.body_route(decision.ranked, decision.pinned)
