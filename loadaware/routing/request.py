"""Pure parsing of one HTTP request into what routing needs. No I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# The fields of a chat request that reach the chat template (vllm/entrypoints/openai/serving_chat.py).
CHAT_OPTIONS = ("tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template_kwargs")

INFERENCE_PATHS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    kind: str  # "completions" | "chat"
    prompt: str | list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    model: str | None = None
    # vLLM's tenant isolation: the salt enters the hash of the prompt's first KV block, so the request only
    # hits blocks cached under the same salt (None: unsalted; vLLM rejects an empty or non-string salt).
    cache_salt: str | None = None
    # A chat's fields that reach the template as vLLM passes them (tools, documents, add_generation_prompt,
    # continue_final_message, chat_template_kwargs); None: none given.
    chat_options: dict[str, Any] | None = None

    @property
    def has_prompt(self) -> bool:
        return bool(self.prompt) or bool(self.messages)


class BadRequest(Exception):
    """The body cannot be an inference request: answered with a clear 400 instead of being routed."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def inference_kind(method: str, path: str) -> str | None:
    """'completions' or 'chat' for the POST paths we route; None for everything that passes through."""
    if method != "POST":
        return None
    return INFERENCE_PATHS.get(path.split("?", 1)[0])


def _first_prompt(prompt: Any) -> str | list[int] | None:
    # A batch prompt routes on its first element: one request lands on one engine either way.
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        head = prompt[0]
        if isinstance(head, int):
            return [t for t in prompt if isinstance(t, int)]
        if isinstance(head, (str, list)):
            return _first_prompt(head)
    return None


def parse_body(kind: str, body: bytes) -> InferenceRequest:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("invalid_json", "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("not_object", "request body must be a JSON object")
    model = data.get("model") if isinstance(data.get("model"), str) else None
    salt = data.get("cache_salt")
    salt = salt if isinstance(salt, str) and salt else None
    if kind == "chat":
        messages = data.get("messages")
        if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
            options = {k: data[k] for k in CHAT_OPTIONS if data.get(k) is not None}
            return InferenceRequest(kind, messages=messages, model=model, cache_salt=salt,
                                    chat_options=options or None)
        return InferenceRequest(kind, model=model, cache_salt=salt)
    return InferenceRequest(kind, prompt=_first_prompt(data.get("prompt")), model=model, cache_salt=salt)
