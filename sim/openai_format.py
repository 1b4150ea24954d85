"""OpenAI-compatible response bodies (vLLM's shapes) for completions and chat completions. Pure."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any


def new_request_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kinds = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError", 503: "ServiceUnavailableError"}
    kind = kinds.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def full_response(chat: bool, request_id: str, model: str, text: str, prompt_tokens: int,
                  completion_tokens: int, finish_reason: str = "length") -> dict[str, Any]:
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        obj = "text_completion"
    return {"id": request_id, "object": obj, "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage(prompt_tokens, completion_tokens)}


class StreamFormatter:
    """Builds the SSE events of one streamed response."""

    def __init__(self, chat: bool, request_id: str, model: str) -> None:
        self.chat = chat
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.obj = "chat.completion.chunk" if chat else "text_completion"

    def _event(self, choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
        body: dict[str, Any] = {"id": self.request_id, "object": self.obj, "created": self.created,
                                "model": self.model, "choices": choices}
        if extra:
            body.update(extra)
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    def role(self) -> bytes:
        """Chat streams open with an empty assistant delta, as vLLM's do."""
        return self._event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}])

    def token(self, text: str, finish_reason: str | None = None) -> bytes:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None,
                                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = None
        return self._event([choice])

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return self._event([], {"usage": usage(prompt_tokens, completion_tokens)})

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"
