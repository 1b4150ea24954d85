"""Rate-limited reports of failures a client or a broken helper can cause on every request.

A hostile client (or a helper failing on each request) must not write a traceback per request: each kind of
failure is logged once per interval with how many more there were, and counted by the caller's metric.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

LOG_INTERVAL_S = 10.0
MAX_KINDS = 256  # distinct keys remembered; past it the table starts afresh (a bound, not an expected case)


class RateLimitedLog:
    """At most one line per key per `interval_s`; the lines held back meanwhile are counted into the next."""

    def __init__(self, logger: logging.Logger, interval_s: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[str, list[float]] = {}  # key -> [when last logged, lines held back since]

    def log(self, level: int, key: str, message: str, *args: object, exc_info: BaseException | None = None) -> bool:
        """Log `message % args` unless `key` was logged within the interval. True if it was logged."""
        now = self.clock()
        entry = self._last.get(key)
        if entry is not None and now - entry[0] < self.interval_s:
            entry[1] += 1
            return False
        held = int(entry[1]) if entry is not None else 0
        if entry is None and len(self._last) >= MAX_KINDS:
            self._last.clear()
        self._last[key] = [now, 0]
        if held:
            message += " (and %d more like it in the last %.0f s)"
            args = (*args, held, self.interval_s)
        self.logger.log(level, message, *args, exc_info=exc_info)
        return True


def describe(exc: BaseException, limit: int = 200) -> str:
    """An exception as one short line: its type and the start of its message (a client may control it)."""
    text = str(exc)
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"{type(exc).__name__}: {text!r}" if text else type(exc).__name__


class ListenerFailures:
    """What the request lifecycle calls when one of its listeners raises: counted in the fallback metric
    (`listener_error`) and logged once per listener and event per interval, not a traceback per request."""

    def __init__(self, count: Callable[[str], None], logger: logging.Logger | None = None) -> None:
        self.count = count
        self.log = RateLimitedLog(logger or logging.getLogger("loadaware.lifecycle"))

    def __call__(self, event: str, listener: object, exc: Exception) -> None:
        self.count("listener_error")
        name = type(listener).__name__
        self.log.log(logging.WARNING, f"{event}:{name}", "lifecycle listener %s failed on %s: %s", name, event,
                     describe(exc))
