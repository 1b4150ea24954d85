"""extproc/shielded.py: an operation outlives its caller's cancellation, and its failure is not left unread."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from loadaware.extproc.shielded import shielded


async def test_a_cancelled_caller_leaves_the_operation_running_to_its_end() -> None:
    release, finished = asyncio.Event(), asyncio.Event()

    async def op() -> str:
        await release.wait()
        finished.set()
        return "done"

    caller = asyncio.ensure_future(shielded(op)())
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller  # the caller ends at once ...
    assert not finished.is_set()
    release.set()
    await asyncio.wait_for(finished.wait(), 1)  # ... and the operation still completes


async def test_results_and_failures_reach_a_caller_that_waits() -> None:
    async def double(x: int) -> int:
        return x * 2

    async def fail() -> None:
        raise ValueError("boom")

    assert await shielded(double)(21) == 42
    with pytest.raises(ValueError, match="boom"):
        await shielded(fail)()


async def test_a_failure_after_the_caller_left_is_not_reported_as_unretrieved() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
    release = asyncio.Event()

    async def fail_later() -> None:
        await release.wait()
        raise RuntimeError("the call is gone")

    caller = asyncio.ensure_future(shielded(fail_later)())
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    release.set()
    for _ in range(3):
        await asyncio.sleep(0)
    gc.collect()  # an unretrieved exception is reported when its task is freed
    await asyncio.sleep(0)
    assert reported == []
