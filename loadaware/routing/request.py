"""Pure parsing of one HTTP request into what routing needs. No I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# The fields of a chat request that reach the chat template (vllm/entrypoints/openai/serving_chat.py).
CHAT_OPTIONS = ("tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template_kwargs")

INFERENCE_PATHS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}

# Bounds on a body (docs/architecture.md, "Input bounds"). Deeper nesting is refused (400): nothing routing
# reads is nested that deep, and every recursive walk downstream (the chat template, vLLM's own parsing) stays
# far from Python's recursion limit. Past a count bound the request is routed on load alone, never refused:
# the engine is the judge of what it accepts, the sidecar only declines to spend work on it.
MAX_NESTING_DEPTH = 64
MAX_MESSAGES = 4096  # a chat's messages rendered through the template
MAX_BATCH_PROMPTS = 4096  # a completions batch (routed on its first prompt)
MAX_PROMPT_TOKEN_IDS = 262_144  # a prompt given as token ids (longer than any context this fleet serves)


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

    # Why the prompt is not scored although the body has one (a bound exceeded); None: nothing withheld.
    unscored: str | None = None

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
    """A batch prompt routes on its first element: one request lands on one engine either way. The shapes
    vLLM takes: a string, token ids, or a list of either (a list of lists: its first)."""
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, list) or not prompt:
        return None
    head = prompt[0]
    if isinstance(head, int):
        return [t for t in prompt if isinstance(t, int)]
    if isinstance(head, str):
        return head
    if isinstance(head, list) and head and isinstance(head[0], int):
        return [t for t in head if isinstance(t, int)]
    return None


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than `limit` deep (the body's top level is depth 1). Iterative: no
    recursion however deep the input."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in (node.values() if isinstance(node, dict) else node):
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def _may_nest_deeper_than(body: bytes | bytearray, limit: int) -> bool:
    """Cheap upper bound: nesting deeper than `limit` needs more than `limit` opening brackets. Counted with
    memchr scans that stop at the bound: a text prompt (one `{`, no `[`) costs three."""
    opened = 0
    for opener in (b"[", b"{"):
        at = body.find(opener)
        while at >= 0:
            opened += 1
            if opened > limit:
                return True
            at = body.find(opener, at + 1)
    return False


def _too_deep() -> BadRequest:
    return BadRequest("nesting_too_deep", f"request body nests deeper than {MAX_NESTING_DEPTH} levels")


def parse_body(kind: str, body: bytes | bytearray) -> InferenceRequest:
    """The request routing reads from a body; BadRequest (a 400) for one that cannot be a request."""
    deep = _may_nest_deeper_than(body, MAX_NESTING_DEPTH)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("invalid_json", "request body is not valid JSON") from None
    except RecursionError:  # json's own guard, far past the bound: ~1,000 levels
        raise _too_deep() from None
    if not isinstance(data, dict):
        raise BadRequest("not_object", "request body must be a JSON object")
    if deep and _nested_deeper_than(data, MAX_NESTING_DEPTH):
        raise _too_deep()
    model = data.get("model") if isinstance(data.get("model"), str) else None
    salt = data.get("cache_salt")
    salt = salt if isinstance(salt, str) and salt else None
    if kind == "chat":
        messages = data.get("messages")
        if isinstance(messages, list) and len(messages) > MAX_MESSAGES:
            return InferenceRequest(kind, model=model, cache_salt=salt, unscored="too_many_messages")
        if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
            options = {k: data[k] for k in CHAT_OPTIONS if data.get(k) is not None}
            return InferenceRequest(kind, messages=messages, model=model, cache_salt=salt,
                                    chat_options=options or None)
        return InferenceRequest(kind, model=model, cache_salt=salt)
    raw = data.get("prompt")
    if isinstance(raw, list) and len(raw) > MAX_BATCH_PROMPTS and not isinstance(raw[0], int):
        return InferenceRequest(kind, model=model, cache_salt=salt, unscored="too_many_prompts")
    prompt = _first_prompt(raw)
    if isinstance(prompt, list) and len(prompt) > MAX_PROMPT_TOKEN_IDS:
        return InferenceRequest(kind, model=model, cache_salt=salt, unscored="prompt_too_long")
    return InferenceRequest(kind, prompt=prompt, model=model, cache_salt=salt)
