"""Tracing on the ext_proc stream (only with --otlp-endpoint; loadaware/telemetry/tracing.py has the rest).

A stream's writes go through `traced_writes` when tracing is on, and through nothing extra when it is off. The
first reply written after the stream has its decision is that decision's reply (a route, the proxy's fallback,
or a local error): its span begins there, and a request headers or body reply also sets `traceparent` on the
upstream request, naming the span, by appending to the reply's cached bytes (replies.py, `with_request_header`).
Fail open: a tracing failure is counted and the reply goes out as it was.
"""

from __future__ import annotations

import logging
from typing import Protocol

from loadaware.extproc.conversation import StreamState, Write
from loadaware.extproc.replies import with_request_header
from loadaware.lifecycle import Decision
from loadaware.telemetry.faults import RateLimitedLog, describe

log = logging.getLogger("loadaware.extproc")
quiet = RateLimitedLog(log)

TRACEPARENT = "traceparent"


class Tracer(Protocol):
    def begin(self, decision: Decision, traceparent: str) -> str:
        """Start the decision's span; the traceparent the upstream request carries."""
        ...


def traced_writes(write: Write, stream: StreamState, tracer: Tracer) -> Write:
    """`write`, beginning the decision's span at its reply and adding the upstream traceparent to it."""
    pending = True

    async def traced(reply: bytes) -> None:
        nonlocal pending
        if pending and stream.decision is not None:
            pending = False
            reply = _traced(reply, stream.decision, stream, tracer)
        await write(reply)

    return traced


def _traced(reply: bytes, decision: Decision, stream: StreamState, tracer: Tracer) -> bytes:
    try:
        return with_request_header(reply, TRACEPARENT, tracer.begin(decision, stream.headers.traceparent))
    except Exception as exc:  # noqa: BLE001 - tracing never fails a request: the reply goes out untraced
        quiet.log(logging.WARNING, "trace_error", "tracing a decision failed: %s", describe(exc))
        return reply


def trace_unreplied(stream: StreamState, tracer: Tracer) -> None:
    """At the stream's end: a decision whose reply was never written (the client left first) still gets its
    span, so every decision has one."""
    decision = stream.decision
    if decision is None or decision.trace is not None:
        return
    try:
        tracer.begin(decision, stream.headers.traceparent)
    except Exception as exc:  # noqa: BLE001 - the stream is ending: nothing may escape it
        quiet.log(logging.WARNING, "trace_error", "tracing a decision failed: %s", describe(exc))
