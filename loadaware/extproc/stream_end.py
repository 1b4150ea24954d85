"""A stream that ends at EOF returns only if its client did not cancel it: a cancelled one ends cancelled.

Why (grpcio 1.85, grpc issue #43360): when Envoy resets an ext_proc stream (a client hang-up, and also the
end of many completed requests), gRPC first completes the handler's pending read with EOF and announces the
cancellation a moment later. A handler that returns at that EOF makes grpc.aio send a status on the
cancelled call; that batch fails, and grpc.aio never frees a failed batch's native op array. Measured with
`python -m research.probes.stream_leak`: ~100 bytes of malloc heap left per cancelled stream, each a small chunk that
also keeps its page from being trimmed or reused. Yielding one turn of the event loop at EOF lets a
cancellation gRPC has already seen land first (the handler then ends with CancelledError and no status is
sent); the call's own `cancelled()` catches one announced but not yet delivered.

The same holds for a stream whose read or write failed because its client left (`client_left`): the handler
ends it with CancelledError rather than returning. Under memray a 20-minute mixed soak in picker mode left one
80-byte op array per client hang-up this way (docs/memory.md, "What the allocations themselves hold").
"""

from __future__ import annotations

import asyncio

import grpc
from grpc._cython import cygrpc

# grpc.aio raises this when a read's or write's batch fails on the call: the call is gone (its client reset or
# cancelled it, or its deadline passed), sometimes before gRPC announces the cancellation (grpcio 1.85).
CALL_GONE: tuple[type[BaseException], ...] = (cygrpc.ExecuteBatchError,)


async def end_at_eof(context: grpc.aio.ServicerContext) -> None:
    """Return if the stream ended by EOF; raise CancelledError if its client cancelled it."""
    if await reset_by_client(context):
        raise asyncio.CancelledError


async def reset_by_client(context: grpc.aio.ServicerContext) -> bool:
    """Whether the client has cancelled the call, after one turn of the loop for a cancellation gRPC has seen
    but not yet announced. A read or write on a call its client reset fails (grpc.aio's ExecuteBatchError,
    1 stream in 100,000 of the fuzzer's): that is a hang-up, not a failure of the sidecar."""
    await asyncio.sleep(0)
    return bool(context.cancelled())


def client_left(exc: BaseException) -> bool:
    """Whether a stream's failure is its call being gone (a reply write that raced the client's cancel, reset or
    deadline): a client that left, not a fault of the sidecar."""
    return isinstance(exc, CALL_GONE)
