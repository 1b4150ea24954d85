"""The Anthropic Messages API as vLLM 0.32 serves it (entrypoints/anthropic): request checks, the conversion
into chat messages (`AnthropicServingMessages.to_chat_completion_request`), the response body and the SSE
events of `message_stream_converter`. Pure; written from vLLM's behaviour, independent of the router's.

vLLM answers a Messages request by converting it to a chat completion request and running that; its id is
the chat completion's ("chatcmpl-..."). Errors from the chat layer take Anthropic's shape
(`{"type": "error", "error": {"type", "message"}}`); a body failing request validation gets vLLM's global
validation handler's answer, the OpenAI shape with type "Bad Request".
"""

from __future__ import annotations

import json
import time
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sim.responses_format import ApiError, invalid

BILLING_HEADER = "x-anthropic-billing-header"  # Claude Code's per-request attribution line, dropped by vLLM
_BLOCK_TYPES = ("text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking",
                "tool_addition", "tool_removal")


def anthropic_error(err: ApiError) -> dict[str, Any]:
    """vLLM's `translate_error_response`: the ErrorResponse's type and message in Anthropic's shape."""
    return {"type": "error", "error": {"type": err.err_type, "message": err.message}}


def detect_merge_inline_system(chat_template: str | None) -> bool:
    """vLLM's `_detect_merge_inline_system`: a template that fails to render [system, user, system, user] in a
    plain sandbox (e.g. Qwen's `loop.first` guard) needs inline system messages merged into the leading one."""
    if not chat_template:
        return True
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    messages = [{"role": r, "content": "t"} for r in ("system", "user", "system", "user")]
    try:
        env.from_string(chat_template).render(messages=messages, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    return False


# ---- request checks --------------------------------------------------------------------------------------
def _check_blocks(blocks: Any, where: str) -> None:
    if not isinstance(blocks, list):
        raise invalid(f"1 validation error:\n  {where}: Input should be a valid string or list", f"body.{where}")
    for block in blocks:
        if not isinstance(block, dict) or block.get("type") not in _BLOCK_TYPES:
            raise invalid(f"1 validation error:\n  {where}: Input tag does not match any of the expected block types",
                          f"body.{where}")


def check_request(body: dict[str, Any]) -> None:
    """The checks vLLM's AnthropicMessagesRequest model applies (a failing body answers 400)."""
    for key in ("model", "messages", "max_tokens"):
        if key not in body:
            raise invalid(f"1 validation error:\n  {key}: Field required", f"body.{key}")
    if not isinstance(body["model"], str) or not body["model"]:
        raise invalid("1 validation error:\n  model: Value error, Model is required", "body.model")
    max_tokens = body["max_tokens"]
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
        raise invalid("1 validation error:\n  max_tokens: Value error, max_tokens must be positive", "body.max_tokens")
    if not isinstance(body["messages"], list):
        raise invalid("1 validation error:\n  messages: Input should be a valid list", "body.messages")
    for i, msg in enumerate(body["messages"]):
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant", "system"):
            raise invalid(f"1 validation error:\n  messages.{i}.role: Input should be 'user', 'assistant' or "
                          "'system'", f"body.messages.{i}.role")
        if not isinstance(msg.get("content"), str):
            _check_blocks(msg.get("content"), f"messages.{i}.content")
    if body.get("system") is not None and not isinstance(body["system"], str):
        _check_blocks(body["system"], "system")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("input_schema"), dict)
            for t in tools)):
        raise invalid("1 validation error:\n  tools: every tool needs a string name and an input_schema object",
                      "body.tools")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise invalid("1 validation error:\n  stream: Input should be a valid boolean", "body.stream")


# ---- conversion ------------------------------------------------------------------------------------------
def _system_text(content: Any) -> str | None:
    """vLLM's `_extract_system_text`: the text blocks joined, billing headers dropped; None when empty."""
    if isinstance(content, str):
        return None if content.startswith(BILLING_HEADER) else content
    parts = [b["text"] for b in content if b.get("type") == "text" and b.get("text")
             and not b["text"].startswith(BILLING_HEADER)]
    return "".join(parts) if parts else None


def to_chat_messages(body: dict[str, Any], merge_inline_system: bool) -> list[dict[str, Any]]:
    """The `messages` of vLLM's converted chat completion request."""
    system_parts: list[str] = []
    system = body.get("system")
    if isinstance(system, str) and system:
        system_parts.append(system)
    elif isinstance(system, list):  # the top-level field: only text blocks, billing headers dropped
        system_parts += [b["text"] for b in system if b.get("type") == "text" and b.get("text")
                         and not b["text"].startswith(BILLING_HEADER)]
    if merge_inline_system:
        system_parts += [t for m in body["messages"] if m["role"] == "system"
                         and (t := _system_text(m["content"]))]
    out: list[dict[str, Any]] = [{"role": "system", "content": "".join(system_parts)}] if system_parts else []
    for msg in body["messages"]:
        if msg["role"] == "system":
            text = None if merge_inline_system else _system_text(msg["content"])
            if text:
                out.append({"role": "system", "content": text})
            continue
        converted: dict[str, Any] = {"role": msg["role"]}
        if isinstance(msg["content"], str):
            converted["content"] = msg["content"]
        else:
            _convert_blocks(msg, converted, out)
        if not (msg["role"] == "user" and "content" not in converted):
            out.append(converted)
    return out


def _convert_blocks(msg: dict[str, Any], converted: dict[str, Any], out: list[dict[str, Any]]) -> None:
    """vLLM's `_convert_message_content`: a user's tool results become tool messages (appended to `out` before the
    message itself), tool uses become tool calls, thinking becomes `reasoning`."""
    parts: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in msg["content"]:
        kind = block["type"]
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            tool_calls.append({"id": block.get("id") or f"call_{int(time.time())}", "type": "function",
                               "function": {"name": block.get("name") or "",
                                            "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result":
            if msg["role"] == "user":
                out.extend(_user_tool_result(block))
            else:
                text = str(block.get("content")) if block.get("content") else ""
                parts.append({"type": "text", "text": f"Tool result: {text}"})
    if reasoning:
        converted["reasoning"] = "".join(reasoning)
    if tool_calls:
        converted["tool_calls"] = tool_calls
    if parts:
        converted["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def _image_url(source: dict[str, Any]) -> str:
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _user_tool_result(block: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM's `_convert_user_tool_result`: a tool message (text parts joined by newlines), then the result's
    images as a user message, then its tool references as a second tool message."""
    content = block.get("content")
    text, images, refs = "", [], []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        items = [i for i in content if isinstance(i, dict)]
        text = "\n".join(str(i.get("text", "")) for i in items if i.get("type") == "text")
        images = [u for i in items if i.get("type") == "image" and (u := _image_url(i.get("source") or {}))]
        refs = [{"type": "tool_reference", "name": n} for i in items
                if i.get("type") == "tool_reference" and (n := i.get("tool_name") or i.get("name"))]
    call_id = block.get("tool_use_id") or ""
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": call_id, "content": text or ""}]
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
    if refs:
        out.append({"role": "tool", "tool_call_id": call_id, "content": refs})
    return out


# ---- bodies ----------------------------------------------------------------------------------------------
def stop_reason(finish_reason: str) -> str:
    """vLLM's `_to_anthropic_stop_reason` for plain text (no tool calls, no stop strings)."""
    return "max_tokens" if finish_reason == "length" else "end_turn"


def full_response(message_id: str, model: str, text: str, input_tokens: int, output_tokens: int,
                  finish_reason: str) -> dict[str, Any]:
    """vLLM's AnthropicMessagesResponse, serialized with exclude_none (so no stop_sequence when null)."""
    return {"id": message_id, "type": "message", "role": "assistant", "content": [{"type": "text", "text": text}],
            "model": model, "stop_reason": stop_reason(finish_reason),
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}


def _sse(kind: str, body: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


class MessagesStream:
    """The events of `message_stream_converter` for a text answer: message_start; at the first token
    content_block_start; content_block_delta per token; content_block_stop, message_delta, message_stop."""

    def __init__(self, message_id: str, model: str, input_tokens: int) -> None:
        self.message_id = message_id
        self.model = model
        self.input_tokens = input_tokens
        self.started = False

    def start(self) -> bytes:
        return _sse("message_start", {"type": "message_start", "message": {
            "id": self.message_id, "type": "message", "role": "assistant", "content": [], "model": self.model,
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}})

    def token(self, piece: str) -> list[bytes]:
        events = []
        if not self.started:
            self.started = True
            events.append(_sse("content_block_start", {"type": "content_block_start",
                                                       "content_block": {"type": "text", "text": ""}, "index": 0}))
        events.append(_sse("content_block_delta", {"type": "content_block_delta",
                                                   "delta": {"type": "text_delta", "text": piece}, "index": 0}))
        return events

    def finish(self, output_tokens: int, finish_reason: str) -> list[bytes]:
        events = [_sse("content_block_stop", {"type": "content_block_stop", "index": 0})] if self.started else []
        events.append(_sse("message_delta", {"type": "message_delta",
                                             "delta": {"stop_reason": stop_reason(finish_reason),
                                                       "stop_sequence": None},
                                             "usage": {"input_tokens": self.input_tokens,
                                                       "output_tokens": output_tokens}}))
        events.append(_sse("message_stop", {"type": "message_stop"}))
        return events
