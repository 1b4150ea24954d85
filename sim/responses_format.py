"""The OpenAI Responses API as vLLM 0.32 serves it (entrypoints/openai/responses): request checks, the
conversion of `instructions` / `input` / a previous response into chat messages, and the response and
stream event bodies. Pure; written from vLLM's behaviour, independent of the router's own conversion.

Conversion (vLLM's `construct_input_messages`): `instructions` become a leading system message; with
`previous_response_id` the stored request's messages follow, minus their system messages (instructions do
not carry over), then one assistant message per text part of the previous output; then the new input: a
string is one user message, a list of items is converted item by item (function calls, reasoning and
assistant text merge into the preceding assistant message when it lacks that field).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

# vLLM's ResponsesRequest fields the sim reads; the rest are accepted and echoed where vLLM echoes them.
_ROLES = ("user", "assistant", "system", "developer")
_CUSTOM_TOOL_INPUT_KEY = "input"  # vLLM's shim for custom tools: {"input": "<payload>"}
_NAMESPACE_SEPARATOR = "__"
# The function tool's fields as vLLM echoes them (the openai SDK's FunctionTool, every optional one null).
_FUNCTION_TOOL_FIELDS = ("name", "parameters", "strict", "type", "allowed_callers", "async", "defer_loading",
                         "description", "output_schema")


def random_id() -> str:
    """vLLM's random_uuid(): 16 hex digits."""
    return f"{uuid.uuid4().int & ((1 << 64) - 1):016x}"


class ApiError(Exception):
    """An error answer with vLLM's ErrorResponse body."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param,
                          "code": self.status}}


def invalid(message: str, param: str | None) -> ApiError:
    """A body that fails vLLM's request validation (FastAPI's RequestValidationError handler: 400 "Bad Request")."""
    return ApiError(400, message, "Bad Request", param)


def not_found(response_id: str) -> ApiError:
    """vLLM's `_make_not_found_error`."""
    return ApiError(404, f"Response with id '{response_id}' not found.", "invalid_request_error", "response_id")


def _check_type(body: dict[str, Any], key: str, types: tuple[type, ...], default: Any = None) -> Any:
    value = body.get(key, default)
    if value is None or (isinstance(value, types) and not (isinstance(value, bool) and bool not in types)):
        return value
    names = " or ".join(t.__name__ for t in types)
    raise invalid(f"1 validation error:\n  {key}: Input should be a valid {names}", f"body.{key}")


@dataclass
class ResponsesRequest:
    body: dict[str, Any]
    input: str | list[dict[str, Any]]
    request_id: str
    instructions: str | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = "auto"


def parse_request(body: dict[str, Any]) -> ResponsesRequest:
    """The checks vLLM's ResponsesRequest model applies, as 400s (never a crash)."""
    if "input" not in body:
        raise invalid("1 validation error:\n  input: Field required", "body.input")
    items = body["input"]
    if not isinstance(items, (str, list)) or (isinstance(items, list)
                                              and not all(isinstance(i, dict) for i in items)):
        raise invalid("1 validation error:\n  input: Input should be a valid string or a list of items",
                      "body.input")
    for key in ("instructions", "model", "previous_response_id", "request_id"):
        _check_type(body, key, (str,))
    for key in ("store", "stream", "background"):
        _check_type(body, key, (bool,))
    max_output = _check_type(body, "max_output_tokens", (int,))
    if body.get("prompt") is not None:
        raise ApiError(400, "prompt template is not supported", param="prompt")
    if body.get("background"):
        if not body.get("store", True):
            raise ApiError(400, "background can only be used when `store` is true", param="background")
        # The sim has no background mode (vLLM runs one as a task, pollable through GET).
        raise ApiError(400, "background mode is not supported by the simulated engine", param="background")
    tools = _check_type(body, "tools", (list,)) or []
    if not all(isinstance(t, dict) and isinstance(t.get("type"), str) for t in tools):
        raise invalid("1 validation error:\n  tools: every tool needs a string 'type'", "body.tools")
    if any(t["type"] == "function" and not isinstance(t.get("name"), str) for t in tools):
        raise invalid("1 validation error:\n  tools: a function tool needs a string 'name'", "body.tools")
    return ResponsesRequest(
        body=body, input=items, request_id=body.get("request_id") or f"resp_{random_id()}",
        instructions=body.get("instructions"), max_output_tokens=max_output,
        previous_response_id=body.get("previous_response_id"), store=body.get("store", True) is True,
        stream=body.get("stream") is True, tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice", "auto"), tools))


def _tool_choice(choice: Any, tools: list[dict[str, Any]]) -> Any:
    """vLLM's `check_tool_usage`: without tools "auto" becomes "none"; a named choice must name a tool."""
    named = isinstance(choice, dict) and choice.get("type") in ("function", "custom")
    if not tools:
        if choice in ("auto", "none"):
            return "none"
        if choice == "required":
            raise ApiError(400, "Tool choice 'required' must be specified with 'tools' parameter.",
                           param="tool_choice")
        if named:
            raise ApiError(400, "Tool choice 'function' not found in 'tools' parameter.", param="tool_choice")
    elif named and choice.get("name") not in {t.get("name") for t in tools}:
        raise ApiError(400, "Tool choice 'function' not found in 'tools' parameter.", param="tool_choice")
    return choice


# ---- conversion ------------------------------------------------------------------------------------------
def construct_input_messages(instructions: str | None, request_input: str | list[dict[str, Any]],
                             prev_messages: list[dict[str, Any]] | None = None,
                             prev_output: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if prev_messages is not None:
        messages.extend(m for m in prev_messages if m.get("role") != "system")
    for item in prev_output or ():
        if item.get("type") == "message":  # reasoning and tool-call output items are skipped, as in vLLM
            messages.extend({"role": "assistant", "content": part.get("text")} for part in item.get("content", ()))
    if isinstance(request_input, str):
        messages.append({"role": "user", "content": request_input})
        return messages
    converted: list[dict[str, Any]] = []
    for item in request_input:
        message = _item_message(item, converted[-1] if converted else None)
        if message is not None:
            converted.append(message)
    messages.extend(converted)
    return messages


def _item_message(item: dict[str, Any], prev: dict[str, Any] | None) -> dict[str, Any] | None:
    """One input item as a chat message, or None when it merged into `prev` (the previous converted one)."""
    prev_assistant = prev if prev is not None and prev.get("role") == "assistant" else None
    kind = item.get("type")
    tool_call = _tool_call(item)
    if tool_call is not None:
        calls = prev_assistant.get("tool_calls") if prev_assistant is not None else ()
        if prev_assistant is not None and (calls is None or isinstance(calls, list)):
            prev_assistant["tool_calls"] = [*(calls or ()), tool_call]
            return None
        return {"role": "assistant", "tool_calls": [tool_call]}
    if kind == "reasoning" and isinstance(item.get("summary"), list):
        reasoning = _reasoning_text(item)
        if prev_assistant is not None and prev_assistant.get("reasoning") is None:
            prev_assistant["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if "role" in item:
        if item["role"] not in _ROLES:
            raise invalid(f"1 validation error:\n  input: unknown role {item['role']!r}", "body.input")
        if not isinstance(item.get("content"), (str, list)):
            raise invalid("1 validation error:\n  input: a message's content must be a string or a list",
                          "body.input")
        if item["role"] == "assistant":
            return _assistant_text(item, prev_assistant)
        return item
    raise ApiError(400, f"Unsupported input item type: {kind}", param="input")


def _tool_call(item: dict[str, Any]) -> dict[str, Any] | None:
    kind = item.get("type")
    if kind == "function_call" and all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
        name = item["name"]
        if item.get("namespace"):
            name = f"{item['namespace']}{_NAMESPACE_SEPARATOR}{name}"
        return {"id": item["call_id"], "function": {"name": name, "arguments": item["arguments"]}, "type": "function"}
    if kind == "custom_tool_call" and isinstance(item.get("call_id"), str):
        arguments = json.dumps({_CUSTOM_TOOL_INPUT_KEY: item.get("input") or ""}, ensure_ascii=False)
        return {"id": item["call_id"], "function": {"name": item.get("name"), "arguments": arguments},
                "type": "function"}
    return None


def _reasoning_text(item: dict[str, Any]) -> str:
    if item.get("encrypted_content"):
        raise ApiError(400, "Encrypted content is not supported.", param="input")
    for key in ("content", "summary"):  # content first; vLLM falls back to the summary with a warning
        parts = item.get(key)
        if isinstance(parts, list) and parts and isinstance(parts[0], dict):
            return str(parts[0].get("text", ""))
    return ""


def _assistant_text(item: dict[str, Any], prev_assistant: dict[str, Any] | None) -> dict[str, Any] | None:
    content = item["content"]
    text = content if isinstance(content, str) else (content[0].get("text") if content
                                                     and isinstance(content[0], dict) else None)
    if text is None:
        return item
    if prev_assistant is not None and prev_assistant.get("content") is None:
        prev_assistant["content"] = text
        return None
    return {"role": "assistant", "content": text}


def continues_final_message(request_input: str | list[dict[str, Any]]) -> bool:
    """vLLM's `should_continue_final_message`: the last item is a message or reasoning item still in progress
    (or incomplete), so the template renders without a generation prompt and the text continues it."""
    if isinstance(request_input, str) or not request_input:
        return False
    last = request_input[-1]
    if last.get("type", "message") not in ("message", "reasoning"):
        return False
    return last.get("status") in ("in_progress", "incomplete")


def trim_to_final_message(rendered: str, messages: list[dict[str, Any]]) -> str:
    """transformers' `continue_final_message`: cut the rendered chat right after the final message's text."""
    final = messages[-1].get("content") or ""
    if isinstance(final, list):
        texts = [p.get("text") for p in final if isinstance(p, dict) and "text" in p]
        final = texts[-1] if texts else ""
    final = str(final)
    stripped = final.strip()
    at = rendered.rfind(stripped)
    if at < 0:
        raise ApiError(400, "continue_final_message is set but the final message does not appear in the chat "
                            "after applying the chat template!")
    return rendered[: at + (len(final) if rendered[at:].strip() == stripped else len(stripped))]


# ---- bodies ----------------------------------------------------------------------------------------------
def _echo_tool(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        return tool
    return {key: tool.get(key) for key in _FUNCTION_TOOL_FIELDS}


def output_message(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [output_text(text, None)] if text else []
    return {"id": item_id, "content": content, "role": "assistant", "status": status, "type": "message",
            "phase": None}


def output_text(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def usage(input_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """vLLM's ResponseUsage for one generation (SimpleContext: no per-turn metrics)."""
    return {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0,
                                     "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [],
                                      "tool_output_tokens_per_turn": []},
            "total_tokens": input_tokens + output_tokens}


def response_body(req: ResponsesRequest, model: str, created: int, max_tokens: int, output: list[dict[str, Any]],
                  status: str, usage_body: dict[str, Any] | None) -> dict[str, Any]:
    """vLLM's `ResponsesResponse.from_request`, serialized as its router does (every field, nulls included)."""
    b = req.body
    return {
        "id": req.request_id, "created_at": created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions, "metadata": b.get("metadata"), "model": model, "object": "response",
        "output": output,
        "parallel_tool_calls": b.get("parallel_tool_calls") if b.get("parallel_tool_calls") is not None else True,
        "temperature": b.get("temperature") if b.get("temperature") is not None else 1.0,
        "tool_choice": req.tool_choice, "tools": [_echo_tool(t) for t in req.tools],
        "top_p": b.get("top_p") if b.get("top_p") is not None else 1.0,
        "background": bool(b.get("background")), "max_output_tokens": max_tokens,
        "max_tool_calls": b.get("max_tool_calls"), "previous_response_id": req.previous_response_id,
        "prompt": None, "reasoning": b.get("reasoning"), "service_tier": b.get("service_tier") or "auto",
        "status": status, "text": b.get("text"), "top_logprobs": None,
        "truncation": b.get("truncation") or "disabled", "usage": usage_body, "user": b.get("user"),
        "presence_penalty": b.get("presence_penalty") or 0.0, "frequency_penalty": b.get("frequency_penalty") or 0.0,
        "kv_transfer_params": None, "ec_transfer_params": None, "input_messages": None, "output_messages": None,
    }


def now() -> int:
    return int(time.time())


class ResponsesStream:
    """The SSE events of one streamed response, in vLLM's order (the simple, non-Harmony path):
    response.created, response.in_progress, output_item.added, content_part.added, one output_text.delta per
    token, output_text.done, content_part.done, output_item.done, response.completed."""

    def __init__(self, initial: dict[str, Any]) -> None:
        self.sequence = 0
        self.initial = initial
        self.item_id = f"msg_{random_id()}"
        self.text: list[str] = []

    def _event(self, kind: str, fields: dict[str, Any]) -> bytes:
        body = {**fields, "sequence_number": self.sequence, "type": kind}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n".encode()

    def opening(self) -> list[bytes]:
        return [self._event("response.created", {"response": self.initial}),
                self._event("response.in_progress", {"response": self.initial})]

    def first_token(self) -> list[bytes]:
        item = {**output_message(self.item_id, "", "in_progress")}
        return [self._event("response.output_item.added", {"item": item, "output_index": 0}),
                self._event("response.content_part.added", {"content_index": 0, "item_id": self.item_id,
                                                             "output_index": 0, "part": output_text("", [])})]

    def delta(self, piece: str) -> bytes:
        self.text.append(piece)
        return self._event("response.output_text.delta", {"content_index": 0, "delta": piece, "item_id": self.item_id,
                                                          "logprobs": [], "output_index": 0})

    def item(self) -> dict[str, Any]:
        return output_message(self.item_id, "".join(self.text))

    def closing(self) -> list[bytes]:
        if not self.text:
            return []
        text = "".join(self.text)
        ids = {"content_index": 0, "item_id": self.item_id, "output_index": 0}
        done = {"content_index": 0, "item_id": self.item_id, "logprobs": [], "output_index": 0, "text": text}
        return [self._event("response.output_text.done", done),
                self._event("response.content_part.done", {**ids, "part": output_text(text, None)}),
                self._event("response.output_item.done", {"item": self.item(), "output_index": 0})]

    def completed(self, final: dict[str, Any]) -> bytes:
        return self._event("response.completed", {"response": final})
