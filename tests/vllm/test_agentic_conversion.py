"""The sidecar's conversion of Responses and Messages requests to chat is vLLM's: for random requests (every item
and block kind the conversion knows, tools, billing headers, inline system messages merged or not), the chat
messages and tools `routing/agentic.py` makes equal what vLLM 0.32's own functions make
(testkit/vllm_agentic_convert.py, run by the vLLM venv's interpreter), and a request vLLM refuses the sidecar
refuses too. No engine is started."""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any

import pytest

from loadaware.routing.agentic import messages_chat, responses_chat
from loadaware.routing.errors import BadRequest
from testkit import vllm
from testkit.paths import REPO
from tests.vllm.conftest import require_vllm

CASES = 300
WORDS = ["alpha", "beta", "gamma", "tool", "call", "naïve", "x-anthropic-billing-header: h", "  spaced  ", "\n", ""]


def words(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 6)))


def response_item(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["user", "user_parts", "assistant", "assistant_str", "call", "output", "reasoning", "system"])
    if kind == "user":
        return {"role": "user", "content": words(rng)}
    if kind == "user_parts":
        return {"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": words(rng)} for _ in range(rng.randint(1, 3))]}
    if kind == "assistant":
        return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": words(rng)}]}
    if kind == "assistant_str":
        return {"role": "assistant", "content": words(rng)}
    if kind == "call":
        return {"type": "function_call", "call_id": f"c{rng.randint(0, 9)}", "name": rng.choice(["f", "g"]),
                "arguments": json.dumps({"q": words(rng)})}
    if kind == "output":
        return {"type": "function_call_output", "call_id": f"c{rng.randint(0, 9)}", "output": words(rng)}
    if kind == "reasoning":
        return {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": words(rng)}]}
    return {"role": "system", "content": words(rng)}


def responses_case(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m"}
    if rng.random() < 0.6:
        body["instructions"] = words(rng)
    body["input"] = words(rng) if rng.random() < 0.3 else [response_item(rng) for _ in range(rng.randint(1, 6))]
    if rng.random() < 0.5:
        body["tools"] = [{"type": "function", "name": f"t{i}", "parameters": {"type": "object"},
                          **({"description": words(rng)} if rng.random() < 0.5 else {}),
                          **({"strict": True} if rng.random() < 0.3 else {})} for i in range(rng.randint(1, 2))]
    return {"api": "responses", "body": body}


def block(rng: random.Random, role: str) -> dict[str, Any]:
    kind = rng.choice(["text", "text", "thinking", "tool_use", "tool_result", "tool_result_list"])
    if kind == "text":
        return {"type": "text", "text": words(rng) or "x"}
    if kind == "thinking":
        return {"type": "thinking", "thinking": words(rng), "signature": "s"}
    if kind == "tool_use" and role == "assistant":
        return {"type": "tool_use", "id": f"t{rng.randint(0, 9)}", "name": "f", "input": {"q": words(rng)}}
    if kind == "tool_result_list":
        return {"type": "tool_result", "tool_use_id": "t1",
                "content": [{"type": "text", "text": words(rng)} for _ in range(rng.randint(1, 2))]}
    return {"type": "tool_result", "tool_use_id": "t1", "content": words(rng)}


def messages_case(rng: random.Random) -> dict[str, Any]:
    messages = []
    for _ in range(rng.randint(1, 6)):
        role = rng.choice(["user", "assistant", "user", "system"])
        content: Any = words(rng) if rng.random() < 0.4 else [block(rng, role) for _ in range(rng.randint(1, 3))]
        messages.append({"role": role, "content": content})
    body: dict[str, Any] = {"model": "m", "max_tokens": 4, "messages": messages}
    if rng.random() < 0.7:
        body["system"] = words(rng) if rng.random() < 0.5 else \
            [{"type": "text", "text": words(rng) or "s"} for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.4:
        body["tools"] = [{"name": "f", "description": words(rng), "input_schema": {"type": "object"}}]
    return {"api": "messages", "body": body, "merge": rng.random() < 0.5}


def vllms(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = subprocess.run([str(vllm.VLLM_PYTHON), "-P", str(REPO / "testkit" / "vllm_agentic_convert.py")],
                          input="\n".join(json.dumps(c) for c in cases), capture_output=True, text=True,
                          timeout=300, check=True, cwd=REPO)
    return list(json.loads(done.stdout))


def merged(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's inline-system merge, applied by the sidecar's tokenizer when the template needs it: every system
    message's text joined into one leading system message."""
    system = "".join(str(m["content"]) for m in messages if m.get("role") == "system")
    rest = [m for m in messages if m.get("role") != "system"]
    return ([{"role": "system", "content": system}] if system else []) + rest


def ours(case: dict[str, Any]) -> dict[str, Any]:
    try:
        if case["api"] == "responses":
            messages, options = responses_chat(case["body"])
        else:
            messages, options = messages_chat(case["body"])
            messages = merged(messages) if case["merge"] else messages
    except BadRequest as exc:
        return {"error": exc.message}
    return {"messages": messages, "tools": options.get("tools")}


@pytest.fixture(scope="module")
def venv() -> None:
    require_vllm()


def test_the_conversions_are_vllms(venv: None) -> None:
    rng = random.Random(41)
    cases = [responses_case(rng) if i % 2 else messages_case(rng) for i in range(CASES)]
    theirs = vllms(cases)
    compared = refused = 0
    for case, want in zip(cases, theirs):
        got = ours(case)
        if "error" in want:
            # vLLM's request models refuse some random bodies (pydantic): the sidecar need not, but what it
            # refuses vLLM refuses too.
            refused += 1
            continue
        assert "error" not in got, (case, got, want)
        assert got == want, json.dumps({"case": case, "ours": got, "vllm": want}, indent=1)
        compared += 1
    assert compared > CASES * 0.6 and refused < CASES * 0.4, (compared, refused)
