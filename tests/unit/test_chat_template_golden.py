"""Golden: the sidecar's chat token ids equal transformers' `apply_chat_template(..., tokenize=True)`.

Each fixture in tests/fixtures/chat_templates/ is a published chat template (the text from the model's
tokenizer_config.json, as copied in the public repository it names) with the special tokens it needs. Both sides
load the same tokenizer folder: the project's tiny tokenizer with the template's control tokens added as special
tokens, and a tokenizer_config.json holding the template and the special tokens. transformers gets the messages
as vLLM hands them over (vllm/entrypoints/chat_utils.py: text parts joined with newlines for a "string" template,
kept as parts for an "openai" one; tool-call arguments parsed into objects; an assistant's reasoning under both
`reasoning` and `reasoning_content`). `strftime_now` is pinned on both
sides. Either both render the same ids, or both refuse the conversation (a template's raise_exception).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer

from loadaware.tokenize.tokenizer import PromptTokenizer, TokenizerError
from testkit.require import require_module

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the hub
transformers = require_module("transformers", "pip install -e '.[dev]'")
hf_chat_utils = require_module("transformers.utils.chat_template_utils", "pip install -e '.[dev]'")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
TINY = Path(__file__).resolve().parents[2] / "sim" / "assets" / "tiny-model"
NOW = datetime(2025, 3, 7, 9, 30)  # 07 Mar 2025: a day whose rendering differs under %d %b %Y and %B %d, %Y

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"function": {  # no description, keys in another order: vLLM's pydantic dump decides what the template sees
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        "name": "search"}, "type": "function"},
]
CALL = {"id": "abc123XYZ",  # Mistral templates want 9 alphanumerics
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}

# (name, messages, options): the request as a client sends it to /v1/chat/completions.
CONVERSATIONS: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = [
    ("plain", [
        {"role": "system", "content": "You are a terse assistant. Café, naïve — ok?"},
        {"role": "user", "content": "What is KV caching?"},
        {"role": "assistant", "content": "Reusing attention keys and values."},
        {"role": "user", "content": "And prefix caching?"}], {}),
    ("user-only", [{"role": "user", "content": "  Hello there!  "}], {}),
    ("content-parts", [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}]},
    ], {}),
    ("tools", [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": "{\"temperature\": 18}"},
    ], {"tools": TOOLS}),
    ("tools-no-system", [
        {"role": "user", "content": "Search for vLLM."},
    ], {"tools": TOOLS}),
    ("continue-final", [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "One, two,"},
    ], {"add_generation_prompt": False, "continue_final_message": True}),
    ("no-generation-prompt", [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ], {"add_generation_prompt": False}),
    ("documents", [
        {"role": "user", "content": "Summarize the document."},
    ], {"documents": [{"title": "Doc A", "text": "Prefix caching reuses KV blocks."}]}),
    ("reasoning", [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "Four.", "reasoning_content": "Add two and two."},
    ], {"add_generation_prompt": False}),
    ("two-tool-calls", [
        {"role": "user", "content": "Weather in Paris, then search."},
        {"role": "assistant", "content": "Calling both.", "tool_calls": [
            CALL, {**CALL, "id": "def456UVW", "function": {"name": "search", "arguments": "{\"query\": \"vLLM\"}"}}]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": "18C"},
        {"role": "tool", "tool_call_id": "def456UVW", "content": "a serving engine"},
    ], {"tools": TOOLS}),
    ("template-kwargs", [
        {"role": "user", "content": "Think or not?"},
    ], {"chat_template_kwargs": {"enable_thinking": False}}),
]


def _fixtures() -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.json"))


@pytest.fixture(scope="module", params=_fixtures())
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    fx = json.loads((FIXTURES / f"{request.param}.json").read_text())
    folder = tmp_path_factory.mktemp(request.param)
    tok = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in fx["control_tokens"]])
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 32768,
              "chat_template": fx["chat_template"], **fx["special_tokens"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    yield request.param, folder


@pytest.fixture(autouse=True)
def pinned_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    class Pinned(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return NOW

    monkeypatch.setattr(hf_chat_utils, "datetime", Pinned)


def as_vllm_passes(messages: list[dict[str, Any]], content_format: str) -> list[dict[str, Any]]:
    """What vLLM gives transformers for a client's messages (vllm/entrypoints/chat_utils.py)."""
    out = []
    for m in messages:
        content = m.get("content")
        if content is None:
            content = [] if content_format == "openai" else ""
        elif isinstance(content, list) and content_format == "string":
            content = "\n".join(p["text"] for p in content if p.get("type") == "text")
        msg: dict[str, Any] = {"role": m["role"], "content": content}
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in m["tool_calls"]]
        reasoning = m.get("reasoning", m.get("reasoning_content"))
        if m["role"] == "assistant" and reasoning is not None:
            msg["reasoning"] = msg["reasoning_content"] = reasoning
        if "tool_call_id" in m:
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def as_vllm_dumps(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """vLLM's ChatCompletionToolsParam(type="function", function=FunctionDefinition(name, description=None,
    parameters=None)).model_dump()."""
    if tools is None:
        return None
    return [{"type": t.get("type", "function"), "function": {
        "name": t["function"]["name"], "description": t["function"].get("description"),
        "parameters": t["function"].get("parameters")}} for t in tools]


def transformers_ids(folder: Path, messages: list[dict[str, Any]], options: dict[str, Any],
                     content_format: str) -> list[int] | str:
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))
    continue_final = bool(options.get("continue_final_message", False))
    try:
        ids = hf.apply_chat_template(
            as_vllm_passes(messages, content_format), tools=as_vllm_dumps(options.get("tools")),
            documents=options.get("documents"), add_generation_prompt=options.get("add_generation_prompt", True),
            continue_final_message=continue_final, tokenize=True, return_dict=False,
            **options.get("chat_template_kwargs", {}))
    except Exception as exc:  # noqa: BLE001 - the template refused the conversation: the sidecar must refuse too
        return f"refused: {type(exc).__name__}"
    return list(ids)


def sidecar_ids(folder: Path, messages: list[dict[str, Any]], options: dict[str, Any]) -> list[int] | str:
    tok = PromptTokenizer(str(folder), clock=lambda: NOW)
    try:
        return tok.encode_chat(messages, options)
    except TokenizerError as exc:
        return f"refused: {exc}"


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=[c[0] for c in CONVERSATIONS])
def test_token_ids_match_transformers(model: tuple[str, Path],
                                      conversation: tuple[str, list[dict[str, Any]], dict[str, Any]]) -> None:
    name, folder = model
    _, messages, options = conversation
    tok = PromptTokenizer(str(folder), clock=lambda: NOW)
    assert tok.chat_template is not None, tok.chat_unavailable
    theirs = transformers_ids(folder, messages, options, tok.chat_template.content_format)
    ours = sidecar_ids(folder, messages, options)
    if isinstance(theirs, str):
        assert isinstance(ours, str), f"{name}: transformers refused ({theirs}) but the sidecar rendered"
    else:
        assert ours == theirs


def test_every_template_renders_plain_and_tool_chats(model: tuple[str, Path]) -> None:
    """The parity above is not vacuous: every fixture renders the plain chat and a tools chat."""
    name, folder = model
    for conv in ("plain", "user-only", "tools-no-system"):
        _, messages, options = next(c for c in CONVERSATIONS if c[0] == conv)
        ids = sidecar_ids(folder, messages, options)
        assert not isinstance(ids, str) and ids, f"{name} {conv}: {ids}"


PRINTS_TODAY = {"llama-3.2", "granite-3.3", "smollm3"}  # templates whose system block shows strftime_now's date


def test_strftime_now_reaches_the_rendered_chat(model: tuple[str, Path]) -> None:
    name, folder = model
    chat = [{"role": "user", "content": "hi"}]
    pinned = PromptTokenizer(str(folder), clock=lambda: NOW).render_chat(chat)
    later = PromptTokenizer(str(folder), clock=lambda: datetime(2031, 12, 1)).render_chat(chat)
    assert (pinned != later) == (name in PRINTS_TODAY)
    if name in PRINTS_TODAY:
        assert "2025" in pinned and "2031" in later
