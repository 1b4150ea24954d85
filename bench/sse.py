"""Count server-sent events in a response body that arrives in arbitrary pieces. Pure, no I/O.

An event ends with a blank line. The engines (vLLM and the simulator) end every event with `\\n\\n` and
close a completion stream with `data: [DONE]\\n\\n`; a `\\r\\n\\r\\n` line ending is not counted.
"""

from __future__ import annotations

SEPARATOR = b"\n\n"
DONE = b"data: [DONE]\n\n"


class SseCounter:
    """Feed the body piece by piece; `events` is the number of complete events so far, exactly as if the
    whole body had been scanned at once (separators are counted left to right, non-overlapping, also when
    one is split between two pieces); `done` says whether the body so far ends with `data: [DONE]`."""

    __slots__ = ("_carry", "_tail", "events")

    def __init__(self) -> None:
        self.events = 0
        self._carry = b""  # the unmatched last byte of the body, which may begin a separator
        self._tail = b""  # the body's last len(DONE) bytes

    def feed(self, data: bytes) -> int:
        """Take the next piece; returns how many events it completed."""
        if not data:
            return 0
        buf = self._carry + data if self._carry else data
        n = 0
        pos = 0
        while (i := buf.find(SEPARATOR, pos)) >= 0:
            n += 1
            pos = i + len(SEPARATOR)
        self._carry = buf[-1:] if pos < len(buf) and buf[-1:] == b"\n" else b""
        self._tail = (self._tail + data)[-len(DONE):]
        self.events += n
        return n

    @property
    def done(self) -> bool:
        return self._tail == DONE
