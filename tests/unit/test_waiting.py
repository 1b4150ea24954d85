"""The shared waits of tests/conftest.py: they return what the condition produced, and a wait that runs out
fails with a message naming what was awaited and what was last seen."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.conftest import wait_until, wait_until_async


def test_returns_the_first_truthy_value() -> None:
    answers = iter([None, 0, {}, {"ready": True}])
    assert wait_until(lambda: next(answers), message="a ready answer", interval=0) == {"ready": True}


def test_timeout_names_what_was_awaited_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the port to open; last value \[\]") as failure:
        wait_until(lambda: [], message="the port to open", timeout=0.05, interval=0.01)
    assert "timed out after 0.05 s" in str(failure.value)


def test_message_can_describe_the_state_at_failure() -> None:
    counter = itertools.count()
    with pytest.raises(AssertionError, match=r"waiting for count to reach -1 \(at \d+\)"):
        wait_until(lambda: next(counter) < 0, message=lambda: f"count to reach -1 (at {next(counter)})",
                   timeout=0.05, interval=0.01)


def test_ignored_errors_count_as_not_yet_and_show_in_the_failure() -> None:
    refusals = iter([ConnectionRefusedError("refused"), ConnectionRefusedError("refused")])

    def probe() -> str:
        for refusal in refusals:
            raise refusal
        return "up"

    assert wait_until(probe, message="the server", ignoring=(ConnectionRefusedError,), interval=0) == "up"

    def always_refused() -> bool:
        raise ConnectionRefusedError("still refused")

    with pytest.raises(AssertionError, match=r"last attempt raised ConnectionRefusedError\('still refused'\)"):
        wait_until(always_refused, message="the server", ignoring=(ConnectionRefusedError,), timeout=0.05,
                   interval=0.01)
    # anything else is a failure of the check itself, raised at once
    with pytest.raises(ValueError):
        wait_until(lambda: int("x"), message="a number", ignoring=(ConnectionRefusedError,))


async def test_async_wait_awaits_coroutine_predicates_and_lets_the_loop_run() -> None:
    event = asyncio.Event()
    asyncio.get_running_loop().call_later(0.02, event.set)

    async def is_set() -> bool:
        return event.is_set()

    assert await wait_until_async(is_set, message="the event", interval=0.005) is True
    assert await wait_until_async(lambda: asyncio.sleep(0, result="done"), message="an awaitable") == "done"


async def test_async_timeout_names_what_was_awaited() -> None:
    with pytest.raises(AssertionError, match="waiting for the feed to connect; last value False"):
        await wait_until_async(lambda: False, message="the feed to connect", timeout=0.05, interval=0.01)
