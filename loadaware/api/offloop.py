"""Run a page's rendering in a worker thread, with the cyclic garbage collector paused meanwhile.

Why the pause: at 10,000 endpoints /metrics and /debug/state build hundreds of thousands of short-lived
containers (samples, label dicts, rows). They live until the page is done, so the collector promotes them
and then runs full collections over the whole heap, each holding the GIL (and so the event loop) for
180-400 ms at 10,000 endpoints (timed with a `gc.callbacks` hook, as `bench/fleet_size.py` counts them).
They form no cycles, so reference counting frees them when the render returns; the collector resumes when
the last concurrent render ends.

And the interpreter's thread switch interval is shortened meanwhile (5 ms to 0.5 ms): the loop's thread,
woken for a decision while a render holds the GIL, waits up to one interval for it at each wake-up. A
shorter interval costs the render some speed (more hand-overs), not the decisions.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

PIECE_ITEMS = 64  # a container larger than this is encoded item by item
RENDER_SWITCH_INTERVAL_S = 0.0005

_lock = threading.Lock()
_paused = 0  # renders running with the collector paused
_was_enabled = False
_switch_interval = 0.0


def _render(fn: Callable[[], T]) -> T:
    global _paused, _was_enabled, _switch_interval
    with _lock:
        if _paused == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
            _switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_interval, RENDER_SWITCH_INTERVAL_S))
        _paused += 1
    try:
        return fn()
    finally:
        with _lock:
            _paused -= 1
            if _paused == 0:
                sys.setswitchinterval(_switch_interval)
                if _was_enabled:
                    gc.enable()


def dumps_in_pieces(value: Any) -> str:
    """json.dumps(value), made of many small dumps: the C encoder holds the GIL for a whole call (a
    10,000-row /debug/state is ~150 ms of it), so a big document encoded at once in a worker thread would stall
    the event loop's thread as long; between small calls the GIL changes hands."""
    if isinstance(value, dict) and len(value) > PIECE_ITEMS:
        return "{" + ", ".join(f"{json.dumps(str(k))}: {dumps_in_pieces(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)) and len(value) > PIECE_ITEMS:
        return "[" + ", ".join(dumps_in_pieces(v) for v in value) + "]"
    if isinstance(value, dict) and any(isinstance(v, (dict, list, tuple)) for v in value.values()):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {dumps_in_pieces(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


async def off_loop(fn: Callable[[], T]) -> T:
    """`fn()` in a worker thread, the collector paused while it runs."""
    return await asyncio.to_thread(_render, fn)
