"""What both processing modes share: one stream's state, and deciding a request from its body."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from loadaware.admission.controller import AdmissionController, Verdict
from loadaware.extproc.metadata import RequestHeaders, served_endpoint, status_of
from loadaware.extproc.replies import Replies
from loadaware.extproc.response_ids import ResponseIdReader
from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.routing.pipeline import Decider
from loadaware.routing.request import BadRequest, InferenceRequest, parse_body
from loadaware.telemetry.faults import RateLimitedLog, describe
from loadaware.telemetry.metrics import Metrics

log = logging.getLogger("loadaware.extproc")
# A client can send bad bodies at will: one line per reason per interval, not one per request.
quiet = RateLimitedLog(log)

MODEL_NAME_SHOWN = 256  # characters of a requested model's name echoed in the 404 (bounds the reply)

# A held request's Envoy message timeout covers its time to live plus this (its decision after the release).
HOLD_MARGIN_S = 5.0
# The reason a shed request's 429 names (llm-d's equivalent is x-llm-d-request-dropped-reason).
DROPPED_REASON_HEADER = "x-loadaware-request-dropped-reason"
OVERLOADED = "too_many_open_streams"  # the reason of the 503 past --max-open-streams

# Bodies up to this size are parsed on the event loop (a 1,600-token prompt is ~8 KB and parses in ~20 µs,
# less than a thread hand-off costs); larger ones in a worker thread.
INLINE_PARSE_BYTES = 256 * 1024

Read = Callable[[], Awaitable[Any]]
Write = Callable[[bytes], Awaitable[None]]

@dataclass(frozen=True)
class StreamOptions:
    # With nobody to route to: "unavailable" answers 503, "fallback" lets the proxy's own fallback pick;
    # "auto" = 503 for a picker (full-duplex mode), fallback for the BUFFERED sidecar deployment.
    no_endpoint_reply: str = "auto"
    # Full-duplex mode holds the body here; BUFFERED bodies are capped by Envoy, and by this too when the port
    # is reached without Envoy.
    max_body_bytes: int = 8 * 1024 * 1024
    # The request header that carries a session key (--session-header, lower case; "" = none).
    session_header: str = ""
    # ext_proc streams open at once past which a new request is refused with a 503 (--max-open-streams; 0: none).
    max_open_streams: int = 0


NO_HEADERS = RequestHeaders()


class StreamState:
    """Per-stream state: the request's decision, once made. Shared fleet state lives behind the decider."""

    __slots__ = ("decided", "decision", "headers", "reader", "response_done", "stores", "streamed")

    def __init__(self) -> None:
        self.decision: Decision | None = None
        self.headers = NO_HEADERS  # the request headers the sidecar reads, once they came
        self.decided = False
        # The response's last part was answered: in full-duplex mode Envoy then often resets the stream
        # instead of closing it, which is the normal end of that request, not an abort.
        self.response_done = False
        self.stores = False  # a Responses request the engine may store: its response's id names the holder
        self.streamed = False  # ... whose response is an event stream
        self.reader: ResponseIdReader | None = None  # reading that id from the response body, while it is sought


class Conversation:
    """The parts of the servicer a conversation uses; one instance serves every stream of its mode."""

    json_errors = False  # full-duplex (picker) replies carry their JSON body; BUFFERED relies on Envoy's
    # Every response body passes through the sidecar anyway (the picker): a stored response's id is read from a
    # stream too. BUFFERED asks for a body only where it is one or two messages (not an event stream: a chunk per
    # token would each cost a message, ~0.24 ms of sidecar CPU); a streamed one's holder is found by asking.
    sees_every_response = False

    def __init__(self, decider: Decider, lifecycle: RequestLifecycle, metrics: Metrics, replies: Replies,
                 options: StreamOptions, admission: AdmissionController | None = None) -> None:
        self.decider = decider
        self.admission = admission  # None: every request is decided at once (--admission off)
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.replies = replies
        self.options = options
        self._errors: dict[tuple[int, str], bytes] = {}

    def error(self, status: int, reason: str, message: str, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
        """An immediate reply, cached per (status, reason): the message and headers depend only on them."""
        reply = self._errors.get((status, reason))
        if reply is None:
            if self.json_errors:
                kind = "invalid_request_error" if status < 500 else "service_unavailable"
                reply = Replies.immediate_json(status, message, kind, reason, headers=headers)
            else:
                reply = Replies.immediate_error(status, message, reason, headers=headers)
            self._errors[(status, reason)] = reply
        return reply

    def overloaded(self) -> bytes:
        """The 503 for a request that finds --max-open-streams streams open: the sidecar holds no more. Retry-After
        1 s: streams end as their responses do (a pile of them is most often engines that stopped answering)."""
        return self.error(503, OVERLOADED, "the router has too many requests in flight",
                          headers=(("retry-after", "1"), (DROPPED_REASON_HEADER, OVERLOADED)))

    def unroutable_reply(self, decision: Decision, picker: bool, model: str | None = None) -> bytes | None:
        """The 503 for a decision with nobody to route to, when the setting (or the mode) says so; the 404 for a
        model no engine serves, in every mode (no engine could answer it otherwise)."""
        if decision.endpoint is not None:
            return None
        if decision.outcome == "unknown_model":
            return self.unknown_model(model or "")
        mode = self.options.no_endpoint_reply
        if mode == "fallback" or (mode == "auto" and not picker):
            return None
        if decision.outcome == "no_eligible_endpoints":
            return self.error(503, "no_eligible_endpoints", "no endpoint in the proxy's subset is ready")
        return self.error(503, "no_endpoints", "no ready endpoint")

    def unknown_model(self, model: str) -> bytes:
        """vLLM's answer to a model it does not serve (not cached: the message names the model)."""
        message = f"The model `{model[:MODEL_NAME_SHOWN]}` does not exist."
        if self.json_errors:
            return Replies.immediate_json(404, message, "NotFoundError", "unknown_model", param="model")
        # BUFFERED: envoy/envoy.yaml's local_reply_config wraps the text into the same JSON for a 404.
        return Replies.immediate_error(404, message, "unknown_model")

    def responded(self, stream: StreamState, msg: Any) -> None:
        """The response headers: the request's outcome. The engine the proxy reports as having served counts
        only if the decision named it: a made-up one must not get health state or metric series."""
        decision = stream.decision
        if decision is None:
            return
        served = served_endpoint(msg)
        if served is not None and served != decision.served and served not in decision.ranked and not any(
                c.endpoint == served for c in decision.candidates):
            served = None
        status = status_of(msg.response_headers)
        self.lifecycle.responded(decision, status, served)
        if stream.stores and status == 200 and self.decider.state is not None and (
                self.sees_every_response or not stream.streamed):
            stream.reader = ResponseIdReader()

    def read_state(self, stream: StreamState, chunk: bytes) -> None:
        """A response body chunk of a request that may have stored state: once its id is read, the engine that
        served is its holder (fleet/state_holders.py)."""
        reader = stream.reader
        if reader is None:
            return
        response_id = reader.feed(chunk)
        if reader.done:
            stream.reader = None
        decision, state = stream.decision, self.decider.state
        if response_id is not None and decision is not None and decision.served and state is not None:
            try:
                state.learn(response_id, decision.served)
                self.metrics.state_learned.inc()
            except Exception as exc:  # noqa: BLE001 - a follow-up may then need to ask the engines, nothing more
                quiet.log(logging.WARNING, "state_learn_error", "learning a response's holder failed: %s",
                          describe(exc))

    async def parse(self, kind: str, body: bytes | bytearray, request_id: str) -> InferenceRequest | bytes:
        """The request, or the 400 reply for a body that cannot be one. A large body is parsed in a worker
        thread: a multi-megabyte json.loads on the event loop would stall every open stream meanwhile."""
        if len(body) > self.options.max_body_bytes:
            return self.rejected(413, "request_too_large", "request body is too large", request_id)
        try:
            if len(body) > INLINE_PARSE_BYTES:
                parsed = await asyncio.to_thread(parse_body, kind, body)
            else:
                parsed = parse_body(kind, body)
            self.metrics.api_requests.labels(kind).inc()
            return parsed
        except BadRequest as exc:
            return self.rejected(400, exc.reason, exc.message, request_id)
        except Exception as exc:  # noqa: BLE001 - a parser bug must not fail the stream: route on load alone
            self.metrics.fallback("parse_error")
            quiet.log(logging.WARNING, "parse_error", "request_id=%s body parse failed: %s", request_id,
                      describe(exc))
            return InferenceRequest(kind, unscored="parse_error")

    def rejected(self, status: int, reason: str, message: str, request_id: str) -> bytes:
        """The local reply for a request the sidecar refuses, counted and logged rate-limited."""
        self.metrics.decided("none", "rejected")
        self.metrics.fallback(reason)
        quiet.log(logging.INFO, reason, "request_id=%s rejected: %s", request_id, message)
        return self.error(status, reason, message)

    async def decide(self, request: InferenceRequest | None, request_id: str, stream: StreamState,
                     parse_s: float | None = None, subset: frozenset[str] | None = None,
                     verdict: Verdict | None = None) -> Decision:
        """The stream's decision, made at most once: whatever order or repetition of messages a client sends,
        a stream takes one in-flight count and its end releases it. `verdict`: what admission made of it."""
        if stream.decision is not None:
            return stream.decision
        decision: Decision | None = None
        try:
            room = self.admission.room_for(verdict) if verdict is not None and self.admission else None
            decision = await self.decider.decide(request, request_id, parse_s=parse_s, subset=subset,
                                                 session=stream.headers.session, room=room)
        finally:
            if verdict is not None and self.admission is not None:
                self.admission.settled(verdict, decision)
        stream.decision = decision  # no await between the count and recording it on the stream
        stream.stores = request is not None and request.stores
        stream.streamed = request is not None and request.streamed
        head = stream.headers
        if head.objective or head.fairness_id or verdict is not None:
            decision.objective, decision.fairness_id = head.objective, head.fairness_id
            if verdict is not None:
                decision.priority, decision.admission_wait_s = verdict.priority, verdict.wait_s
        return decision

    async def admit(self, size: int, request_id: str, stream: StreamState, write: Write,
                    extend_timeout: bool) -> Verdict | bytes | None:
        """Admission's verdict on a request of `size` body bytes: a Verdict to decide with, the 429 reply for a
        shed one, or None without admission. `extend_timeout`: before holding, ask Envoy for a message timeout
        that covers the hold (BUFFERED: its per-message timer runs while the body message waits)."""
        admission = self.admission
        if admission is None:
            return None
        head = stream.headers

        async def on_hold(seconds: float) -> None:
            if extend_timeout:
                await write(Replies.message_timeout(seconds + HOLD_MARGIN_S))

        verdict = await admission.admit(head.objective, head.fairness_id, size, request_id, on_hold)
        if verdict.admitted:
            return verdict
        self.metrics.decided("none", "shed")
        quiet.log(logging.INFO, verdict.outcome, "request_id=%s shed: %s (priority %d)", request_id,
                  verdict.outcome, verdict.priority)
        message = f"the pool is saturated and this request was shed ({verdict.outcome})"
        extra = (("retry-after", str(verdict.retry_after_s)), (DROPPED_REASON_HEADER, verdict.outcome))
        if self.json_errors:
            return Replies.immediate_json(429, message, "rate_limit_exceeded", verdict.outcome, headers=extra)
        return Replies.immediate_error(429, message, verdict.outcome, headers=extra)


async def timed_parse(conversation: Conversation, kind: str, body: bytes | bytearray,
                      request_id: str) -> tuple[InferenceRequest | bytes, float]:
    started = time.perf_counter()
    parsed = await conversation.parse(kind, body, request_id)
    return parsed, time.perf_counter() - started


def new_request_id() -> str:
    return uuid.uuid4().hex
