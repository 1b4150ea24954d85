"""Shared by every test directory: waiting on a condition instead of sleeping for a guessed time.

Tests import the helpers (`from tests.conftest import wait_until, wait_until_async`; pytest's
`pythonpath = ["."]` makes `tests` importable), so helper modules that are not tests use them too.

A test waits for the state it needs, never for a fixed time: on a busy machine (two cores shared by Envoy,
the sidecar, the simulated engines and the load generator) any fixed sleep is sometimes too short. The
timeout only bounds how long a broken behaviour takes to fail, so it is generous; a passing wait returns as
soon as its condition holds.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

# A test whose real component is missing skips locally and fails under CI=true (testkit/require.py), and a
# CI=true run with any skip for a missing component fails.
pytest_plugins = ("testkit.require",)

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_INTERVAL_S = 0.05

Message = str | Callable[[], str]


class _Attempts:
    """What the predicate last answered, for a failure message that shows how far the wait got."""

    def __init__(self, message: Message, timeout: float) -> None:
        self.message = message
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.count = 0
        self.last_value: object = None
        self.last_error: BaseException | None = None

    def settled(self, value: object, error: BaseException | None = None) -> bool:
        """Record one check (its value, or the ignored error it raised): True when the value is truthy; the
        timeout's AssertionError once the deadline has passed."""
        self.count += 1
        if error is None and value:
            return True
        self.last_value, self.last_error = value, error
        if time.monotonic() >= self.deadline:
            raise self.failure()
        return False

    def failure(self) -> AssertionError:
        what = self.message() if callable(self.message) else self.message
        if self.last_error is not None:
            last = f"last attempt raised {self.last_error!r}"
        else:
            last = f"last value {self.last_value!r}"
        error = AssertionError(f"timed out after {self.timeout:g} s ({self.count} checks) waiting for {what}; {last}")
        error.__cause__ = self.last_error
        return error


def wait_until(predicate: Callable[[], T | None], *, message: Message, timeout: float = DEFAULT_TIMEOUT_S,
               interval: float = DEFAULT_INTERVAL_S,
               ignoring: tuple[type[BaseException], ...] = ()) -> T:
    """Call `predicate` until it returns something truthy and return that; fail after `timeout` seconds
    with an AssertionError naming `message` (a string, or a callable evaluated at failure for the state
    then). Exceptions of the `ignoring` types count as "not yet" (e.g. a port that does not accept yet)."""
    attempts = _Attempts(message, timeout)
    while True:
        error: BaseException | None = None
        value: Any  # T once truthy
        try:
            value = predicate()
        except ignoring as exc:
            value, error = None, exc
        if attempts.settled(value, error):
            return value
        time.sleep(interval)


@overload
async def wait_until_async(predicate: Callable[[], Awaitable[T | None]], *, message: Message,
                           timeout: float = ..., interval: float = ...,
                           ignoring: tuple[type[BaseException], ...] = ()) -> T: ...


@overload
async def wait_until_async(predicate: Callable[[], T | None], *, message: Message,
                           timeout: float = ..., interval: float = ...,
                           ignoring: tuple[type[BaseException], ...] = ()) -> T: ...


async def wait_until_async(predicate: Callable[[], Any], *, message: Message,
                           timeout: float = DEFAULT_TIMEOUT_S, interval: float = DEFAULT_INTERVAL_S,
                           ignoring: tuple[type[BaseException], ...] = ()) -> Any:
    """`wait_until` for async tests: the event loop keeps running between checks, and `predicate` may be
    a coroutine function (or return an awaitable, e.g. `asyncio.to_thread(...)`), which is awaited."""
    attempts = _Attempts(message, timeout)
    while True:
        error: BaseException | None = None
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
        except ignoring as exc:
            value, error = None, exc
        if attempts.settled(value, error):
            return value
        await asyncio.sleep(interval)
