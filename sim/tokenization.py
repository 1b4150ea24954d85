"""Tokenize exactly as vLLM does, with the shared tiny tokenizer.

/v1/completions: `encode(prompt, add_special_tokens=True)`, or a list of token ids used as-is.
/v1/chat/completions: render the tokenizer's jinja chat template (add_generation_prompt=True, with
bos_token / eos_token in scope, like transformers' apply_chat_template) and encode with
add_special_tokens=False, because the template already placed every special token.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

# Encoding a few KB costs well under a millisecond; above this size it moves to a thread so a huge prompt
# never stalls the other engines sharing the event loop.
_INLINE_CHARS = 16_384


_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


class PromptError(ValueError):
    """The request names no usable prompt (maps to HTTP 400)."""


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            # vLLM parses these part types as text (chat_utils TEXT_PART_TYPES; the Responses API sends
            # input_text / output_text parts).
            if isinstance(part, dict) and part.get("type") in _TEXT_PARTS:
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        # vLLM flattens text parts for string-format templates with "\n".join (chat_utils).
        return "\n".join(parts)
    raise PromptError("message content must be a string or a list of text parts")


def _raise_template_error(message: str) -> None:
    raise PromptError(message)


class SimTokenizer:
    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        self.bos_token: str | None = config.get("bos_token")
        self.eos_token: str | None = config.get("eos_token")
        self.max_model_len: int = int(config.get("model_max_length", 32768))
        # The same environment options transformers' apply_chat_template uses.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.globals["raise_exception"] = _raise_template_error  # templates call it on bad input, as in HF
        self.chat_template: str = config["chat_template"]
        self._template = env.from_string(self.chat_template)

    def render_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        if not isinstance(messages, list) or not messages:
            raise PromptError("messages must be a non-empty list")
        normalized = []
        for m in messages:
            if not isinstance(m, dict) or "role" not in m:
                raise PromptError("every message needs a role")
            normalized.append({**m, "content": _content_text(m.get("content"))})
        return self._template.render(
            messages=normalized,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def encode_prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=True).ids
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise PromptError("prompt must be a string or a non-empty list of token ids")

    def encode_chat(self, messages: Any) -> list[int]:
        return self.tokenizer.encode(self.render_chat(messages), add_special_tokens=False).ids

    def encode_request(self, body: dict[str, Any], chat: bool) -> list[int]:
        if chat:
            if "messages" not in body:
                raise PromptError("missing 'messages'")
            return self.encode_chat(body["messages"])
        if "prompt" not in body:
            raise PromptError("missing 'prompt'")
        return self.encode_prompt(body["prompt"])

    async def encode_request_async(self, body: dict[str, Any], chat: bool) -> list[int]:
        size = len(body.get("prompt", "")) if isinstance(body.get("prompt"), str) else 0
        if chat and isinstance(body.get("messages"), list):
            size = sum(len(str(m.get("content", ""))) for m in body["messages"] if isinstance(m, dict))
        if size <= _INLINE_CHARS:
            return self.encode_request(body, chat)
        return await asyncio.to_thread(self.encode_request, body, chat)

    def decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])
