"""Run with the vLLM venv's interpreter: vLLM's own conversion of Responses and Messages requests to chat.

Reads one JSON case per line on stdin ({"api": "responses"|"messages", "body": ..., "merge": bool}) and prints a
JSON list: per case the chat messages and tools vLLM 0.32 renders (its `construct_input_messages` and
`construct_tool_dicts`; `AnthropicServingMessages.to_chat_completion_request`), or the error it raises.
tests/vllm/test_agentic_conversion.py compares the sidecar's conversion with it. Standard library + vLLM only.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.openai.responses.utils import construct_input_messages, construct_tool_dicts


def _dump(o: Any) -> Any:
    return o.model_dump()


def main() -> None:
    out: list[dict[str, Any]] = []
    for line in sys.stdin:
        out.append(convert(json.loads(line)))
    print(json.dumps(out))


def convert(case: dict[str, Any]) -> dict[str, Any]:
    try:
        if case["api"] == "responses":
            req = ResponsesRequest(**case["body"])
            msgs = construct_input_messages(request_instructions=req.instructions, request_input=req.input)
            tools = construct_tool_dicts(req.tools, req.tool_choice)
            return {"messages": json.loads(json.dumps(msgs, default=_dump)), "tools": tools}
        areq = AnthropicMessagesRequest(**case["body"])
        chat = AnthropicServingMessages.to_chat_completion_request(areq, merge_inline_system=case.get("merge", False))
        return {"messages": json.loads(json.dumps(chat.messages, default=_dump)),
                "tools": [t.model_dump() for t in chat.tools] if chat.tools else None}
    except Exception as e:  # noqa: BLE001 - the case's answer is vLLM's refusal
        return {"error": f"{type(e).__name__}: {e}"[:200]}


if __name__ == "__main__":
    main()
