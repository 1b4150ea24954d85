"""The Responses and Messages APIs as the chat the engine renders. Pure: no I/O.

vLLM 0.32 converts both to chat messages and renders them with the model's chat template; the facts followed here
(docs/architecture.md, "Generation APIs") are from its sources:

- Responses (`vllm/entrypoints/openai/responses/utils.py::construct_input_messages` and the request's model in
  `vllm/entrypoints/openai/responses/protocol.py`): `instructions` becomes a leading system message; `input` as a
  string is one user message; as items: a `function_call` (or `custom_tool_call`) joins the previous assistant
  message's tool calls, a `reasoning` item its reasoning, an assistant `message` its content (the first part's text),
  a `function_call_output` is a tool message, and any other item with a role is a message as it is. Function tools are
  flattened to chat tools (namespace tools as `<namespace>__<name>`); other tool types never reach the template. A
  final assistant message or reasoning item whose status is `in_progress` or `incomplete` is continued instead of
  answered. `reasoning.effort` reaches the template as `reasoning_effort` (and `enable_thinking` unless the request
  sets it).
- Messages (`vllm/entrypoints/anthropic/serving.py::to_chat_completion_request`): the `system` text (blocks joined
  with "", less Claude Code's `x-anthropic-billing-header` block) is a leading system message; blocks become text
  content, `thinking` the assistant's reasoning, `tool_use` tool calls (arguments as JSON), a user's `tool_result`
  a tool message; tools are chat tools with `input_schema` as parameters. Inline system messages are merged into
  the leading one when the template requires system-first ordering: the tokenizer knows the template, so the
  parse asks for it (`merge_inline_system`) and the tokenizer decides.

A follow-up naming `previous_response_id` is rendered by its holder from the stored conversation; the sidecar sees
only the new input, so it places the request by state (routing/pipeline.py), not by this prompt.
"""

from __future__ import annotations

import json
from typing import Any

from loadaware.routing.errors import BadRequest

NAMESPACE_SEPARATOR = "__"  # vllm/tool_parsers/utils.py: flat_namespace_tool_name
CUSTOM_TOOL_INPUT_KEY = "input"
BILLING_HEADER = "x-anthropic-billing-header"
MAX_ID_CHARS = 256  # a stored response's id (vLLM's are "resp_" + 32 hex digits)

Messages = list[dict[str, Any]]


def _bad(message: str, param: str = "input") -> BadRequest:
    return BadRequest(f"invalid_{param}", message)


# --- Responses ----------------------------------------------------------------------------------------------------

def responses_chat(data: dict[str, Any]) -> tuple[Messages, dict[str, Any]]:
    """The chat messages and template options of a Responses request (its own input only)."""
    messages: Messages = []
    instructions = data.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    raw = data.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list):
        for item in raw:
            message = _from_item(item, messages[-1] if messages else None)
            if message is not None:
                messages.append(message)
    elif raw is not None:
        raise _bad("input must be a string or a list of items")
    return messages, _responses_options(data, raw)


def _tool_call(item: dict[str, Any]) -> dict[str, Any] | None:
    kind = item.get("type")
    if kind == "function_call":
        name = str(item.get("name", ""))
        if isinstance(item.get("namespace"), str) and item["namespace"]:
            name = f"{item['namespace']}{NAMESPACE_SEPARATOR}{name}"
        return {"id": item.get("call_id"), "function": {"name": name, "arguments": item.get("arguments")},
                "type": "function"}
    if kind == "custom_tool_call":
        arguments = json.dumps({CUSTOM_TOOL_INPUT_KEY: item.get("input") or ""}, ensure_ascii=False)
        return {"id": item.get("call_id"), "function": {"name": item.get("name"), "arguments": arguments},
                "type": "function"}
    return None


def _reasoning_text(item: dict[str, Any]) -> str:
    if item.get("encrypted_content"):
        raise _bad("Encrypted content is not supported.")
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts and isinstance(parts[0], dict):
            return str(parts[0].get("text", ""))
    return ""


def _assistant_text(item: dict[str, Any]) -> str | None:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
        return text if isinstance(text, str) else None
    return None


def _from_item(item: Any, previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """One input item as vLLM makes it a message; None when it joined `previous` (an assistant message)."""
    if not isinstance(item, dict):
        raise _bad("input items must be objects")
    assistant = previous if previous is not None and previous.get("role") == "assistant" else None
    kind = item.get("type")
    call = _tool_call(item)
    if call is not None:
        if assistant is not None:
            assistant.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        text = _reasoning_text(item)
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = text
            return None
        return {"role": "assistant", "reasoning": text}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if item.get("role") == "assistant":
        said = _assistant_text(item)
        if said is not None:
            if assistant is not None and assistant.get("content") is None:
                assistant["content"] = said
                return None
            return {"role": "assistant", "content": said}
    if "role" in item:
        return dict(item)
    raise _bad(f"Unsupported input item type: {kind}")


def _continues(raw: Any) -> bool:
    """vLLM's should_continue_final_message: a partial assistant message or reasoning item is continued."""
    if not isinstance(raw, list) or not raw or not isinstance(raw[-1], dict):
        return False
    last = raw[-1]
    if last.get("type", "message") not in ("message", "reasoning"):
        return False
    if last.get("type", "message") == "message" and last.get("role") != "assistant":
        return False
    return last.get("status") in ("in_progress", "incomplete")


def _responses_tools(data: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = data.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    out: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise _bad("tools must be objects", "tools")
        if tool.get("type") == "function":
            out.append(_function_tool(tool))
        elif tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            for inner in tool["tools"]:
                if isinstance(inner, dict) and inner.get("type") == "function":
                    out.append(_function_tool({**inner, "name": f"{tool.get('name')}{NAMESPACE_SEPARATOR}"
                                                                f"{inner.get('name')}"}))
    return out or None


def _function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A flat Responses function tool as a chat tool."""
    return _chat_tool(tool, tool.get("parameters"))


def _chat_tool(tool: dict[str, Any], parameters: Any) -> dict[str, Any]:
    """A chat tool as vLLM's FunctionDefinition dumps it: name, description, parameters, then strict and
    defer_loading only when set."""
    if not isinstance(tool.get("name"), str):
        raise _bad("a tool needs a name", "tools")
    function: dict[str, Any] = {"name": tool["name"], "description": tool.get("description"),
                                "parameters": parameters}
    for key in ("strict", "defer_loading"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _responses_options(data: dict[str, Any], raw: Any) -> dict[str, Any]:
    continues = _continues(raw)
    options: dict[str, Any] = {"add_generation_prompt": not continues}
    if continues:
        options["continue_final_message"] = True
    tools = _responses_tools(data)
    if tools is not None:
        options["tools"] = tools
    kwargs = dict(data["chat_template_kwargs"]) if isinstance(data.get("chat_template_kwargs"), dict) else {}
    reasoning = data.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if effort is not None:
        kwargs.setdefault("reasoning_effort", effort)
        kwargs.setdefault("enable_thinking", effort != "none")
    if kwargs:
        options["chat_template_kwargs"] = kwargs
    return options


def previous_response_id(data: dict[str, Any]) -> str | None:
    value = data.get("previous_response_id")
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
        raise _bad("previous_response_id must be a response id", "previous_response_id")
    return value


# --- Messages -----------------------------------------------------------------------------------------------------

def messages_chat(data: dict[str, Any]) -> tuple[Messages, dict[str, Any]]:
    """The chat messages and template options of an Anthropic Messages request."""
    raw = data.get("messages")
    if not isinstance(raw, list):
        raise _bad("messages must be a list", "messages")
    messages: Messages = []
    system = _system_text(data.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for msg in raw:
        if not isinstance(msg, dict):
            raise _bad("messages must be objects", "messages")
        _add_message(msg, messages)
    options: dict[str, Any] = {"merge_inline_system": True}
    tools = _anthropic_tools(data.get("tools"))
    if tools is not None:
        options["tools"] = tools
    if isinstance(data.get("chat_template_kwargs"), dict):
        options["chat_template_kwargs"] = dict(data["chat_template_kwargs"])
    return messages, options


def _block_texts(blocks: Any) -> str:
    if isinstance(blocks, str):
        return "" if blocks.startswith(BILLING_HEADER) else blocks
    if not isinstance(blocks, list):
        return ""
    return "".join(b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text"
                   and isinstance(b.get("text"), str) and b["text"] and not b["text"].startswith(BILLING_HEADER))


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system  # vLLM strips the billing header from blocks only
    return _block_texts(system)


def _add_message(msg: dict[str, Any], out: Messages) -> None:
    role = msg.get("role")
    content = msg.get("content")
    if role == "system":
        text = _block_texts(content)
        if text:
            out.append({"role": "system", "content": text})
        return
    message: dict[str, Any] = {"role": role}
    if isinstance(content, str):
        message["content"] = content
    elif isinstance(content, list):
        _add_blocks(content, message, out)
    if not (role == "user" and "content" not in message):
        out.append(message)


def _add_blocks(blocks: list[Any], message: dict[str, Any], out: Messages) -> None:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        if not isinstance(block, dict):
            raise _bad("content blocks must be objects", "messages")
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": str(block["text"])})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": ""}})  # the media never reaches the text
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(str(block["thinking"]))
        elif kind == "tool_use":
            calls.append({"id": block.get("id") or "call", "type": "function",
                          "function": {"name": block.get("name") or "",
                                       "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result":
            _tool_result(block, message.get("role"), out, parts)
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    if parts:
        message["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def _tool_result(block: dict[str, Any], role: Any, out: Messages, parts: list[dict[str, Any]]) -> None:
    content = block.get("content")
    if role != "user":
        parts.append({"type": "text", "text": f"Tool result: {str(content) if content else ''}"})
        return
    text = content if isinstance(content, str) else ""
    if isinstance(content, list):
        text = "\n".join(str(i.get("text", "")) for i in content if isinstance(i, dict) and i.get("type") == "text")
    out.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": text or ""})


def _anthropic_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad("tools must be a list", "tools")
    if not all(isinstance(tool, dict) for tool in tools):
        raise _bad("tools must be objects", "tools")
    return [_chat_tool(tool, tool.get("input_schema")) for tool in tools]
