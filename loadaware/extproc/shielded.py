"""A stream's reads and writes run to their end even when the stream's task is cancelled.

Why (grpcio 1.85, grpc issue #43360): grpc.aio frees a batch's native op array only when the coroutine that
started the batch sees it complete. When Envoy resets an ext_proc stream (a client hang-up, and also the end
of most completed requests: two thirds of the soak's streams) grpc.aio cancels the handler's task while it
waits in a read, and that read's array is never freed. Run in a task of its own, which the handler's
cancellation does not reach, an operation sees its batch complete (gRPC completes every pending batch of a
cancelled call at once) and frees the array; the handler still ends at once, with CancelledError.

Cost: a stream's reads run in one task for the whole stream (`ShieldedReads`), which reads the next message as
soon as the handler has taken the last one and hands it over through a future; its writes run in another
(`ShieldedWrites`), in order, each one's end handed over through a future. Each takes the handler about one
event-loop turn more than a plain await; a task and an asyncio.shield per operation took about three (a
streamed response's chunk is a read and a write: `python -m bench.extproc_inprocess`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

T = TypeVar("T")


def _consume(task: asyncio.Future[Any]) -> None:
    # The operation of a cancelled stream often fails (the call is gone) when nobody awaits it any more: its
    # outcome is read here, so it is not logged as "exception was never retrieved".
    if not task.cancelled():
        task.exception()


def _wake(future: asyncio.Future[None] | None) -> None:
    """Resolve a future one side of a stream waits on, if it still waits."""
    if future is not None and not future.done():
        future.set_result(None)


def _started(run: Awaitable[None]) -> asyncio.Task[None]:
    """The stream's task of its own; its outcome read when it ends, whoever awaits it."""
    task = asyncio.ensure_future(run)
    task.add_done_callback(_consume)
    return task


def _hand_over(task: asyncio.Future[T], waiter: asyncio.Future[T]) -> None:
    """The operation's outcome to the caller's future, unless the caller has gone (then it is only read)."""
    if waiter.done():
        _consume(task)
    elif task.cancelled():
        waiter.cancel()
    elif (exc := task.exception()) is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(task.result())


class ShieldedReads:
    """`read()` of one stream: every read runs in one task of the stream's own, started at the first call; it
    reads the next message as soon as the handler has taken the last one (at most one message waits), and ends
    after EOF or a failure, or once `close()` is called and its read in progress has completed. A cancelled
    handler leaves the read in progress to finish."""

    def __init__(self, read: Callable[[], Awaitable[Any]]) -> None:
        self._read = read
        self._task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[Any] | None = None  # the handler's, while it waits for a message
        self._ready: asyncio.Future[Any] | None = None  # a message (or failure) read and not yet taken
        self._taken: asyncio.Future[None] | None = None  # the reader's, while a message waits to be taken
        self._closed = False

    async def __call__(self) -> Any:
        if self._task is None:
            self._task = _started(self._run())
        ready = self._ready
        if ready is not None:
            self._ready = None
            taken, self._taken = self._taken, None
            _wake(taken)
            return ready.result()
        if self._closed or self._task.done():
            raise RuntimeError("the stream's reads have ended")
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            return await waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        """The stream is over: the reader ends once its read in progress completes, and reads nothing more."""
        self._closed = True
        _wake(self._taken)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        eof = grpc.aio.EOF
        while not self._closed:
            outcome: asyncio.Future[Any] = loop.create_future()
            try:
                message = await self._read()
            except BaseException as exc:  # noqa: BLE001 - handed to the handler, which raises it
                outcome.set_exception(exc)
                outcome.exception()  # retrieved: a failure nobody takes any more is not reported
                message = eof
            else:
                outcome.set_result(message)
            if self._closed:  # the stream is over: nobody will take it
                return
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                _hand_over(outcome, waiter)
            else:
                self._ready = outcome
                if message is not eof:
                    taken = self._taken = loop.create_future()
                    await taken
            if message is eof:
                return
            # Not kept by this frame while the next read waits (until the engine answers, for a request's body).
            del message, outcome, waiter


class ShieldedWrites:
    """`write(reply)` of one stream: the writes run in order in one task of the stream's own, started at the
    first; each caller waits for its own write's end (or failure). A cancelled caller leaves its write, and
    any queued before it, to finish; `close()` ends the task once the queue is empty. A write not yet started
    when `gone()` says the call is cancelled is not started: it fails with CancelledError (a batch started on a
    cancelled call fails, and grpc.aio never frees a failed batch's op array)."""

    def __init__(self, write: Callable[[Any], Awaitable[Any]], gone: Callable[[], bool] = lambda: False) -> None:
        self._write = write
        self._gone = gone
        self._queue: deque[tuple[Any, asyncio.Future[Any]]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.Future[None] | None = None  # the writer's, while the queue is empty
        self._closed = False

    async def __call__(self, reply: Any) -> Any:
        if self._closed:
            raise RuntimeError("the stream's writes have ended")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._queue.append((reply, done))
        if self._task is None:
            self._task = _started(self._run())
        else:
            _wake(self._idle)
        return await done

    def close(self) -> None:
        """The stream is over: the writer ends once what is queued is written."""
        self._closed = True
        _wake(self._idle)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        queue = self._queue
        while True:
            while queue:
                reply, done = queue.popleft()
                try:
                    if self._gone():
                        raise asyncio.CancelledError
                    result = await self._write(reply)
                except BaseException as exc:  # noqa: BLE001 - handed to its caller, which raises it
                    if not done.done():  # else its caller has gone, and with it the stream: nothing to tell
                        done.set_exception(exc)
                        done.exception()  # retrieved: a caller cancelled meanwhile is not reported as unread
                else:
                    if not done.done():
                        done.set_result(result)
            if self._closed:
                return
            idle = self._idle = loop.create_future()
            await idle
            self._idle = None
