"""Pure parsing of one HTTP request into what routing needs. No I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from loadaware.routing.agentic import MAX_ID_CHARS, messages_chat, previous_response_id, responses_chat
from loadaware.routing.errors import BadRequest

__all__ = ["STATE_KIND", "BadRequest", "InferenceRequest", "inference_kind", "parse_body", "state_path_id",
           "state_request"]

# The fields of a chat request that reach the chat template (vllm/entrypoints/openai/serving_chat.py).
CHAT_OPTIONS = ("tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template_kwargs")

# The POST paths decided by their prompt: every generation API vLLM serves (docs/architecture.md, "Generation
# APIs"). The Responses and Messages APIs are rendered as the chat vLLM makes of them (routing/agentic.py).
INFERENCE_PATHS = {"/v1/completions": "completions", "/v1/chat/completions": "chat", "/v1/responses": "responses",
                   "/v1/messages": "messages"}
CHAT_KINDS = frozenset({"chat", "responses", "messages"})
# A stored response's own paths (GET /v1/responses/{id}, POST /v1/responses/{id}/cancel): placed on the engine that
# holds it, with no prompt to read.
RESPONSES_PREFIX = "/v1/responses/"
STATE_KIND = "response_state"

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
    kind: str  # "completions" | "chat" | "responses" | "messages" | "response_state"
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
    # The stored response this request needs (a Responses follow-up's previous_response_id, or the id in a stored
    # response's own path): it goes to the engine that holds it (routing/pipeline.py). None: no state.
    state_id: str | None = None
    # A Responses request the engine may store (`store` not false): the sidecar learns which engine made it from
    # the response's id (extproc: the response body of these requests only).
    stores: bool = False
    # The response is streamed (`"stream": true`): one body chunk per event. BUFFERED mode does not read those
    # (each chunk would cost the sidecar a message); a follow-up then finds the holder by asking the engines.
    streamed: bool = False

    @property
    def has_prompt(self) -> bool:
        return bool(self.prompt) or bool(self.messages)


def inference_kind(method: str, path: str) -> str | None:
    """The kind of request for the paths we decide (INFERENCE_PATHS' POSTs, a stored response's own paths); None
    for everything that passes through."""
    bare = path.split("?", 1)[0]
    if method == "POST":
        kind = INFERENCE_PATHS.get(bare)
        if kind is not None:
            return kind
        return STATE_KIND if state_path_id(method, bare) is not None else None
    if method == "GET" and state_path_id(method, bare) is not None:
        return STATE_KIND
    return None


def state_path_id(method: str, path: str) -> str | None:
    """The response id in GET /v1/responses/{id} or POST /v1/responses/{id}/cancel; None for any other path."""
    bare = path.split("?", 1)[0]
    if not bare.startswith(RESPONSES_PREFIX):
        return None
    rest = bare[len(RESPONSES_PREFIX):]
    if method == "POST":
        if not rest.endswith("/cancel"):
            return None
        rest = rest[:-len("/cancel")]
    elif method != "GET":
        return None
    if not rest or "/" in rest or len(rest) > MAX_ID_CHARS:
        return None
    return unquote(rest)


def state_request(method: str, path: str) -> InferenceRequest | None:
    """The request for a stored response's own path (placed on its holder); None for any other path."""
    response_id = state_path_id(method, path)
    return None if response_id is None else InferenceRequest(STATE_KIND, state_id=response_id)


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
    if kind == "responses":
        return _responses(data, model, salt)
    if kind == "messages":
        return _messages(data, model, salt)
    if kind == STATE_KIND:  # a cancel's body carries nothing routing reads: the id is in the path
        return InferenceRequest(kind, model=model)
    raw = data.get("prompt")
    if isinstance(raw, list) and len(raw) > MAX_BATCH_PROMPTS and not isinstance(raw[0], int):
        return InferenceRequest(kind, model=model, cache_salt=salt, unscored="too_many_prompts")
    prompt = _first_prompt(raw)
    if isinstance(prompt, list) and len(prompt) > MAX_PROMPT_TOKEN_IDS:
        return InferenceRequest(kind, model=model, cache_salt=salt, unscored="prompt_too_long")
    return InferenceRequest(kind, prompt=prompt, model=model, cache_salt=salt)


def _too_many(items: Any) -> bool:
    return isinstance(items, list) and len(items) > MAX_MESSAGES


def _responses(data: dict[str, Any], model: str | None, salt: str | None) -> InferenceRequest:
    state_id = previous_response_id(data)
    stores = data.get("store", True) is not False  # vLLM's default is to store
    if _too_many(data.get("input")):
        return InferenceRequest("responses", model=model, cache_salt=salt, unscored="too_many_messages",
                                state_id=state_id, stores=stores)
    messages, options = responses_chat(data)
    return InferenceRequest("responses", messages=messages or None, model=model, cache_salt=salt,
                            chat_options=options, state_id=state_id, stores=stores,
                            streamed=data.get("stream") is True)


def _messages(data: dict[str, Any], model: str | None, salt: str | None) -> InferenceRequest:
    if _too_many(data.get("messages")):
        return InferenceRequest("messages", model=model, cache_salt=salt, unscored="too_many_messages")
    messages, options = messages_chat(data)
    return InferenceRequest("messages", messages=messages or None, model=model, cache_salt=salt,
                            chat_options=options)
