"""extproc/shielded.py: a stream's reads run in one task that reads at most one message ahead and ends with the
stream, and its writes in another, in order; an operation outlives its caller's cancellation, and its failure
is not left unread."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from loadaware.extproc.shielded import ShieldedReads, ShieldedWrites


class Reads:
    """A stream's reads: each waits for its message to be released; counts the reads started."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.started = 0

    async def read(self) -> Any:
        self.started += 1
        item = await self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item


async def test_reads_hand_over_in_order_and_read_at_most_one_ahead() -> None:
    source = Reads()
    reads = ShieldedReads(source.read)
    for item in ("headers", "body"):
        source.queue.put_nowait(item)
    assert await reads() == "headers"
    for _ in range(5):
        await asyncio.sleep(0)
    assert source.started == 2  # "body" was read ahead, and nothing more until it is taken
    assert await reads() == "body"
    for _ in range(5):
        await asyncio.sleep(0)
    assert source.started == 3  # the next read waits in the source
    source.queue.put_nowait(grpc.aio.EOF)
    assert await reads() is grpc.aio.EOF
    await asyncio.sleep(0)
    assert source.started == 3  # nothing is read after EOF


async def reader_cancelled_while_reading() -> tuple[Reads, ShieldedReads]:
    """A stream whose handler was cancelled while it waited for a message (it ends at once)."""
    source = Reads()
    reads = ShieldedReads(source.read)
    handler = asyncio.ensure_future(reads())
    await asyncio.sleep(0)
    handler.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handler
    return source, reads


async def test_a_cancelled_reader_leaves_its_read_running_and_close_ends_it() -> None:
    source, reads = await reader_cancelled_while_reading()  # the handler ended at once ...
    assert reads._task is not None and not reads._task.done()  # ... while its read waits on
    source.queue.put_nowait("late")  # the read completes ...
    for _ in range(5):
        await asyncio.sleep(0)
    assert not reads._task.done()  # ... and its message waits to be taken, with no read after it
    assert source.started == 1
    reads.close()
    await asyncio.wait_for(reads._task, 1)  # the stream is over: the reader ends, reading nothing more
    assert source.started == 1


async def test_close_during_a_read_ends_the_reader_when_the_read_completes() -> None:
    source, reads = await reader_cancelled_while_reading()
    reads.close()
    assert reads._task is not None and not reads._task.done()  # its read runs to its end ...
    source.queue.put_nowait(RuntimeError("the call is gone"))
    await asyncio.wait_for(reads._task, 1)  # ... and then it ends, the failure read, not reported


async def test_a_read_failure_reaches_the_handler() -> None:
    source = Reads()
    reads = ShieldedReads(source.read)
    source.queue.put_nowait(ValueError("reset"))
    with pytest.raises(ValueError, match="reset"):
        await reads()
    assert reads._task is not None
    await asyncio.wait_for(reads._task, 1)  # a failure ends the reads
    with pytest.raises(RuntimeError):
        await reads()


class Writes:
    """A stream's writes: each waits until released; records what was written, in order."""

    def __init__(self) -> None:
        self.written: list[Any] = []
        self.release = asyncio.Event()

    async def write(self, reply: Any) -> None:
        await self.release.wait()
        if isinstance(reply, BaseException):
            raise reply
        self.written.append(reply)


async def test_writes_run_in_order_and_a_cancelled_writer_leaves_its_write_to_finish() -> None:
    sink = Writes()
    writes = ShieldedWrites(sink.write)
    first = asyncio.ensure_future(writes("headers"))
    await asyncio.sleep(0)
    first.cancel()  # the handler is cancelled while its write waits ...
    with pytest.raises(asyncio.CancelledError):
        await first
    sink.release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert sink.written == ["headers"]  # ... and the write still completes
    assert await writes("body") is None and sink.written == ["headers", "body"]
    writes.close()
    assert writes._task is not None
    await asyncio.wait_for(writes._task, 1)  # the stream is over: the writer ends
    with pytest.raises(RuntimeError):
        await writes("late")


async def test_a_write_failure_reaches_its_caller_and_later_writes_go_on() -> None:
    sink = Writes()
    sink.release.set()
    writes = ShieldedWrites(sink.write)
    with pytest.raises(ValueError, match="reset"):
        await writes(ValueError("reset"))
    await writes("next")
    assert sink.written == ["next"]
    writes.close()


async def test_a_write_not_started_when_the_call_is_gone_is_never_started() -> None:
    """A batch started on a cancelled call fails, and grpc.aio never frees a failed batch's op array: the
    write in progress finishes, but what was queued behind it is not started once the call is cancelled."""
    sink = Writes()
    cancelled = False
    writes = ShieldedWrites(sink.write, gone=lambda: cancelled)
    first = asyncio.ensure_future(writes("headers"))
    await asyncio.sleep(0)  # its batch is in progress
    second = asyncio.ensure_future(writes("body"))
    await asyncio.sleep(0)
    cancelled = True  # the client reset the call meanwhile
    sink.release.set()
    assert await first is None  # started before: completes
    with pytest.raises(asyncio.CancelledError):
        await second
    assert sink.written == ["headers"]
    with pytest.raises(asyncio.CancelledError):
        await writes("late")  # and nothing after it starts either
    assert sink.written == ["headers"]
    writes.close()
