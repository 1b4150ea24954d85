"""The engine's store of Responses API responses and their input messages, as vLLM keeps them in its process.

vLLM (`OpenAIServingResponses`) stores only with `VLLM_ENABLE_RESPONSES_API_STORE=1` and a request's `store`
true (its default); otherwise `store` is silently ignored. A request's chat messages are stored when it is
accepted, its response when it completes, so a follow-up naming an unfinished response answers 404.

vLLM never evicts (its own FIXME: a memory leak). The sim bounds the store: at most `max_entries`
responses and about `max_chars` characters of stored message text, the oldest dropped first.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

ENV_VAR = "VLLM_ENABLE_RESPONSES_API_STORE"
MAX_ENTRIES = 10_000
MAX_CHARS = 64 * 1024 * 1024


def store_enabled(option: bool | None) -> bool:
    """An explicit option wins; otherwise vLLM's env var (`bool(int(...))`) when set; otherwise on (sim default,
    so demos can chain responses; vLLM's own default is off)."""
    if option is not None:
        return option
    value = os.environ.get(ENV_VAR)
    if value is None:
        return True
    try:
        return bool(int(value))
    except ValueError:
        return False


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 8


@dataclass
class _Entry:
    messages: list[dict[str, Any]]
    response: dict[str, Any] | None
    chars: int


class ResponseStore:
    def __init__(self, enabled: bool, max_entries: int = MAX_ENTRIES, max_chars: int = MAX_CHARS) -> None:
        self.enabled = enabled
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put_messages(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        self._drop(response_id)
        entry = _Entry(messages, None, _chars(messages))
        self._entries[response_id] = entry
        self._chars += entry.chars
        while self._entries and (len(self._entries) > self.max_entries or self._chars > self.max_chars):
            self._drop(next(iter(self._entries)))

    def put_response(self, response_id: str, response: dict[str, Any]) -> None:
        entry = self._entries.get(response_id)
        if entry is not None:  # not evicted meanwhile
            entry.response = response

    def response(self, response_id: str) -> dict[str, Any] | None:
        entry = self._entries.get(response_id)
        return entry.response if entry is not None else None

    def messages(self, response_id: str) -> list[dict[str, Any]] | None:
        entry = self._entries.get(response_id)
        return entry.messages if entry is not None else None

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._chars -= entry.chars
