"""A stream that ends at EOF returns only if its client did not cancel it: a cancelled one ends cancelled.

Why (grpcio 1.85, grpc issue #43360): when Envoy resets an ext_proc stream (a client hang-up, and also the
end of many completed requests), gRPC first completes the handler's pending read with EOF and announces the
cancellation a moment later. A handler that returns at that EOF makes grpc.aio send a status on the
cancelled call; that batch fails, and grpc.aio never frees a failed batch's native op array. Measured with
`python -m research.probes.stream_leak`: ~100 bytes of malloc heap left per cancelled stream, each a small chunk that
also keeps its page from being trimmed or reused. Waiting briefly at EOF (a turn of the event loop, then up to
RESET_GRACE_S) lets the cancellation land first (the handler then ends with CancelledError and no status is
sent); the call's own `cancelled()` catches one announced but not yet delivered.

The same holds for a stream whose read or write failed because its client left (`client_left`): the handler
ends it with CancelledError rather than returning. Under memray, a 20-minute mixed soak in picker mode left 864
of these 80-byte op arrays in 11 minutes with one turn of the loop, and 100 with the wait (docs/memory.md,
"What the allocations themselves hold").
"""

from __future__ import annotations

import asyncio

import grpc
from grpc._cython import cygrpc

# How long a stream at EOF waits for its reset to be announced, in steps. With one turn of the loop alone, ~5% of
# a picker soak's streams that ended by EOF were reset after it (an 80-byte array each); these waits caught
# ~88% of those. A stream its client really half-closed gets its status that much later; its request was
# released before the wait. Only a real grpc.aio call announces a reset late: an in-process caller's context
# (the benchmarks' rigs) waits one turn.
RESET_WAITS_S = (0.0, 0.002, 0.008, 0.03)
RESET_GRACE_S = sum(RESET_WAITS_S)
GRPC_CALL: type = getattr(cygrpc, "_ServicerContext", type(None))

# grpc.aio raises this when a read's or write's batch fails on the call: the call is gone (its client reset or
# cancelled it, or its deadline passed), sometimes before gRPC announces the cancellation (grpcio 1.85).
CALL_GONE: tuple[type[BaseException], ...] = (cygrpc.ExecuteBatchError,)


async def end_at_eof(context: grpc.aio.ServicerContext) -> None:
    """Return if the stream ended by EOF; raise CancelledError if its client cancelled it."""
    if await reset_by_client(context):
        raise asyncio.CancelledError


async def reset_by_client(context: grpc.aio.ServicerContext) -> bool:
    """Whether the client has cancelled the call, waiting a little (RESET_WAITS_S: a turn of the loop, then up
    to RESET_GRACE_S) for a cancellation gRPC has seen but not yet announced. A read or write on a call its
    client reset fails (grpc.aio's ExecuteBatchError, 1 stream in 100,000 of the fuzzer's): that is a hang-up,
    not a failure of the sidecar."""
    for wait in RESET_WAITS_S if isinstance(context, GRPC_CALL) else (0.0,):
        await asyncio.sleep(wait)
        if context.cancelled():
            return True
    return False


def client_left(exc: BaseException) -> bool:
    """Whether a stream's failure is its call being gone (a reply write that raced the client's cancel, reset or
    deadline): a client that left, not a fault of the sidecar."""
    return isinstance(exc, CALL_GONE)
