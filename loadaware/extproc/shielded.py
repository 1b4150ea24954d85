"""A stream's reads and writes run to their end even when the stream's task is cancelled.

Why (grpcio 1.85, grpc issue #43360): grpc.aio frees a batch's native op array only when the coroutine that
started the batch sees it complete. When Envoy resets an ext_proc stream (a client hang-up, and also the end
of most completed requests: two thirds of the soak's streams) grpc.aio cancels the handler's task while it
waits in a read, and that read's array is never freed. Run in a task of its own, shielded from the handler's
cancellation, the read sees its batch complete (gRPC completes every pending batch of a cancelled call at
once) and frees the array; the handler still ends at once, with CancelledError.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def _consume(task: asyncio.Future[Any]) -> None:
    # The operation of a cancelled stream often fails (the call is gone) when nobody awaits it any more: its
    # outcome is read here, so it is not logged as "exception was never retrieved".
    if not task.cancelled():
        task.exception()


def shielded(op: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """`op`, each call run in a task of its own that the caller's cancellation does not cancel."""

    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        task = asyncio.ensure_future(op(*args, **kwargs))
        task.add_done_callback(_consume)
        return await asyncio.shield(task)

    return call
