"""The one error a request parse raises."""

from __future__ import annotations


class BadRequest(Exception):
    """The body cannot be an inference request: answered with a clear 400 instead of being routed."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
