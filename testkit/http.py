"""A tiny blocking HTTP client (stdlib): probes and control calls need no event loop and no dependency."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class HTTPStatusError(RuntimeError):
    """A JSON call answered with something other than 200."""


def request(method: str, url: str, body: bytes | None = None, timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body); an HTTP error status is returned, not raised (connection errors still raise)."""
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()


def post_json(url: str, payload: Any, timeout: float = 5.0) -> Any:
    """POST `payload` as JSON and decode the 200 reply; raises HTTPStatusError otherwise."""
    status, body = request("POST", url, json.dumps(payload).encode(), timeout=timeout)
    if status != 200:
        raise HTTPStatusError(f"POST {url} -> HTTP {status}: {body[:200]!r}")
    return json.loads(body)
