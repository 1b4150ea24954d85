"""Start something that may lose a shared port to another run on this machine: wait, then try again."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from testkit.procs import ProcError

log = logging.getLogger("testkit")

T = TypeVar("T")


def _log_retry(what: str, attempt: int, attempts: int, delay_s: float, exc: ProcError) -> None:
    first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    log.warning("%s failed to start (attempt %d/%d), retrying in %g s: %s", what, attempt, attempts, delay_s,
                first_line)


def start_with_retries(start: Callable[[], T], *, attempts: int, what: str, delay_s: float,
                       retry_if: Callable[[ProcError], bool] = lambda _: True,
                       on_retry: Callable[[int, ProcError], None] | None = None) -> T:
    """`start()` until it returns; a ProcError that `retry_if` accepts is retried after `delay_s`, up to
    `attempts` tries in all, and the last one is raised. `start` must clean up after itself on failure.
    `on_retry(attempt, error)` reports a retry (default: a warning on the "testkit" logger)."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except ProcError as exc:
            if attempt == attempts or not retry_if(exc):
                raise
            if on_retry is None:
                _log_retry(what, attempt, attempts, delay_s, exc)
            else:
                on_retry(attempt, exc)
            time.sleep(delay_s)
    raise AssertionError("unreachable: attempts must be >= 1")
