"""Tokenize exactly as the engine does, off the event loop.

Completions: `encode(prompt, add_special_tokens=True)`. Chat: the tokenizer's chat template rendered
first (with the generation prompt), then `encode(text, add_special_tokens=False)`: what vLLM does, and
what a router that only tokenizes `prompt` gets wrong (it never matches chat traffic).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from loadaware.tokenize.pieces import ChunkedEncoder

# A load-time exactness probe for the piece cache: words, digits, punctuation, newlines, non-ASCII.
_PROBE = " ".join(
    f"Paragraph {i}: the quick brown fox, naïve café #{i * 37} jumps over 3 lazy dogs; it's "
    f"done\n\n  - item {i}.\tEnd of line {i} — ok?" for i in range(120))


class TokenizerError(Exception):
    """The prompt could not be tokenized (bad template input, missing template, ...)."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _raise(message: str) -> None:
    raise TokenizerError(message)


def _message_content(content: Any) -> Any:
    # OpenAI content parts: vLLM joins the text parts with newlines before templating.
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content


class PromptTokenizer:
    def __init__(self, path: str) -> None:
        folder, file = (path, os.path.join(path, "tokenizer.json")) if os.path.isdir(path) else \
            (os.path.dirname(path), path)
        self._tokenizer = Tokenizer.from_file(file)
        self.chat_template_source: str | None = None
        self._specials: dict[str, str | None] = {}
        self._load_config(folder)
        self._template: jinja2.Template | None = None
        self._plain = lambda text: self._tokenizer.encode(text, add_special_tokens=False).ids
        self.pieces = ChunkedEncoder(self._plain)
        self.pieces.self_check(_PROBE)
        # Completions add the tokenizer's special tokens; the piece cache only serves when that adds none.
        self._specials_noop = self._tokenizer.encode(_PROBE[:200], add_special_tokens=True).ids == \
            self._plain(_PROBE[:200])
        self._encoded = 0
        if self.chat_template_source:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = _raise
            env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
            self._template = env.from_string(self.chat_template_source)

    def _load_config(self, folder: str) -> None:
        config_path = os.path.join(folder, "tokenizer_config.json")
        config: dict[str, Any] = {}
        if os.path.exists(config_path):
            with open(config_path, encoding="utf-8") as fh:
                config = json.load(fh)
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the "default" one is what the engine uses
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_path = os.path.join(folder, "chat_template.jinja")
        if os.path.exists(jinja_path):
            with open(jinja_path, encoding="utf-8") as fh:
                template = fh.read()
        self.chat_template_source = template if isinstance(template, str) else None
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            self._specials[key] = _token_text(config.get(key))

    def _encode_plain(self, text: str) -> list[int]:
        self._encoded += 1
        if self._encoded % 64 == 0:  # keep checking exactness on live prompts, at ~1/64 of a full encode
            self.pieces.self_check(text)
        return self.pieces.encode(text)

    def encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self._specials_noop:
                return self._encode_plain(prompt)
            return self._tokenizer.encode(prompt, add_special_tokens=True).ids
        return list(prompt)  # pre-tokenized prompts go to the engine as they are

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> str:
        if self._template is None:
            raise TokenizerError("the tokenizer has no chat template")
        normalized = [{**m, "content": _message_content(m.get("content"))} for m in messages]
        try:
            return self._template.render(messages=normalized, add_generation_prompt=True, **self._specials)
        except TokenizerError:
            raise
        except Exception as exc:
            raise TokenizerError(f"chat template failed: {exc}") from exc

    def encode_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self._encode_plain(self.render_chat(messages))


class AsyncTokenizer:
    """Runs a PromptTokenizer in worker threads, time-boxed: the event loop never waits on the CPU work."""

    def __init__(self, tokenizer: PromptTokenizer, timeout_s: float, threads: int = 2) -> None:
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tokenize")

    async def encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        return await self._run(self.tokenizer.encode_prompt, prompt)

    async def encode_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return await self._run(self.tokenizer.encode_chat, messages)

    async def _run(self, fn: Any, arg: Any) -> list[int]:
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(self._pool, fn, arg), self.timeout_s)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
