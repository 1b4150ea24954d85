"""The sidecar's prompt tokens are vLLM's: the same ids as vLLM's /tokenize and the same count as the
`usage.prompt_tokens` of a real completion, for plain prompts, token-id prompts, batches and chats (three
published chat templates, with a system prompt and tools)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from loadaware.tokenize.tokenizer import PromptTokenizer
from testkit.paths import REPO
from testkit.vllm import VllmEngine
from tests.vllm.conftest import complete, token_prompt

TEMPLATES = REPO / "tests" / "fixtures" / "chat_templates"
PROMPTS = [
    "the cache of the engine is warm",
    "Paragraph 7: naïve café #259 — ok?\n\n  - item 3.\tEnd",
    "router gateway envoy " * 40 + "12345!",
]
TOOLS = [{"type": "function", "function": {
    "name": "lookup_prefix", "description": "How many prompt tokens an engine holds",
    "parameters": {"type": "object", "properties": {"engine": {"type": "string"}, "tokens": {"type": "integer"}},
                   "required": ["engine"]}}}]
CHAT = [
    {"role": "system", "content": "You are a router. Answer briefly."},
    {"role": "user", "content": "Which engine holds the prefix of this prompt?"},
    {"role": "assistant", "content": "Engine A holds 256 tokens."},
    {"role": "user", "content": "And engine B? Use the tool."},
]


def test_completion_prompts(pair: tuple[VllmEngine, VllmEngine], tokenizer: PromptTokenizer) -> None:
    a, _ = pair
    for prompt in PROMPTS:
        ours = tokenizer.encode_prompt(prompt)
        theirs = a.post("/tokenize", {"model": a.served_name, "prompt": prompt})["tokens"]
        assert ours == theirs
        assert complete(a, prompt)["usage"]["prompt_tokens"] == len(ours)


def test_token_id_prompts_and_batches(pair: tuple[VllmEngine, VllmEngine], tokenizer: PromptTokenizer) -> None:
    _, b = pair
    ids = token_prompt(11, 77)
    assert complete(b, ids)["usage"]["prompt_tokens"] == len(tokenizer.encode_prompt(ids)) == 77
    # A batch: one request, several prompts; vLLM's usage sums them, the sidecar counts each.
    batch: list[Any] = [PROMPTS[0], PROMPTS[1]]
    assert complete(b, batch)["usage"]["prompt_tokens"] == sum(len(tokenizer.encode_prompt(p)) for p in batch)
    id_batch = [token_prompt(12, 40), token_prompt(13, 9)]
    assert complete(b, id_batch)["usage"]["prompt_tokens"] == 49


def tokenizer_with_template(model_dir: Path, template: str, out: Path) -> PromptTokenizer:
    """The model's tokenizer folder with another chat template: what the sidecar loads for that model."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_dir / "tokenizer.json", out / "tokenizer.json")
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return PromptTokenizer(str(out))


@pytest.mark.parametrize("name", ["own", "qwen2.5", "llama-3.1", "granite-3.3"])
def test_chat_with_system_prompt_and_tools(name: str, pair: tuple[VllmEngine, VllmEngine], model_dir: Path,
                                           tmp_path: Path) -> None:
    a, _ = pair
    if name == "own":  # the model's own template, as the engine serves it by default
        tok, extra = PromptTokenizer(str(model_dir)), {}
    else:
        template = json.loads((TEMPLATES / f"{name}.json").read_text())["chat_template"]
        tok, extra = tokenizer_with_template(model_dir, template, tmp_path / name), {"chat_template": template}
    for options in ({}, {"tools": TOOLS}):
        if name == "own" and options:
            continue  # the project's ChatML template has no tools section
        ours = tok.encode_chat(CHAT, options)
        theirs = a.post("/tokenize", {"model": a.served_name, "messages": CHAT, "add_generation_prompt": True,
                                      **options, **extra})["tokens"]
        assert ours == theirs, f"{name} {list(options)}"
        # tool_choice "none": "auto" needs a tool-call parser; the tools still go through the template.
        choice = {"tool_choice": "none"} if options else {}
        reply = a.post("/v1/chat/completions", {"model": a.served_name, "messages": CHAT, "max_tokens": 1,
                                                "temperature": 0, **options, **choice, **extra})
        assert reply["usage"]["prompt_tokens"] == len(ours)
