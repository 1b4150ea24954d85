"""Reading a stored response's id from the response body, as it streams by.

vLLM's Responses API puts the id first: a JSON response starts `{"id":"resp_…"`, and a stream's first event is
`response.created`, whose `response` object starts with its `id`. So the first `"id"` string in the body is the
response's. Only the body's first READ_LIMIT bytes are looked at; chunks are joined only while the id is not yet
complete in them.
"""

from __future__ import annotations

import re

READ_LIMIT = 16 * 1024
MAX_ID_CHARS = 256
_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,%d})"' % MAX_ID_CHARS)


class ResponseIdReader:
    __slots__ = ("_seen", "done", "response_id")

    def __init__(self) -> None:
        self._seen = b""
        self.done = False  # the id was found, or the limit passed: nothing more to read
        self.response_id: str | None = None

    def feed(self, chunk: bytes) -> str | None:
        """The id once it is complete in what was fed; None before (and after the limit, for good)."""
        if self.done:
            return None
        seen = self._seen + chunk[:READ_LIMIT - len(self._seen)] if self._seen else chunk[:READ_LIMIT]
        match = _ID.search(seen)
        if match is not None:
            self.done = True
            self._seen = b""
            self.response_id = match.group(1).decode("utf-8", "replace")
            return self.response_id
        if len(seen) >= READ_LIMIT:
            self.done = True
            self._seen = b""
            return None
        self._seen = seen
        return None
