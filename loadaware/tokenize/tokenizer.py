"""Tokenize exactly as the engine does, off the event loop.

Completions: `encode(prompt, add_special_tokens=True)`. Chat: the tokenizer's chat template rendered
first (with the generation prompt), then `encode(text, add_special_tokens=False)`: what vLLM does, and
what a router that only tokenizes `prompt` gets wrong (it never matches chat traffic).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tokenizers import Tokenizer

from loadaware.tokenize.chat_template import ChatTemplate, ChatTemplateError, Clock, read_tokenizer_config
from loadaware.tokenize.pieces import ChunkedEncoder

log = logging.getLogger(__name__)

# A load-time exactness probe for the piece cache: words, digits, punctuation, newlines, non-ASCII.
_PROBE = " ".join(
    f"Paragraph {i}: the quick brown fox, naïve café #{i * 37} jumps over 3 lazy dogs; it's "
    f"done\n\n  - item {i}.\tEnd of line {i} — ok?" for i in range(120))


class TokenizerError(Exception):
    """The prompt could not be tokenized (bad template input, missing template, ...)."""


class ChatTemplateUnavailable(LookupError):
    """The tokenizer has no chat template that renders (told once at start): chat traffic routes on load."""


class PromptTokenizer:
    def __init__(self, path: str, clock: Clock | None = None) -> None:
        folder, file = (path, os.path.join(path, "tokenizer.json")) if os.path.isdir(path) else \
            (os.path.dirname(path), path)
        self._tokenizer = Tokenizer.from_file(file)
        self.chat_template_source, self._specials = read_tokenizer_config(folder)
        self._plain = lambda text: self._tokenizer.encode(text, add_special_tokens=False).ids
        self.pieces = ChunkedEncoder(self._plain)
        self.pieces.self_check(_PROBE)
        # Completions add the tokenizer's special tokens; the piece cache only serves when that adds none.
        self._specials_noop = self._tokenizer.encode(_PROBE[:200], add_special_tokens=True).ids == \
            self._plain(_PROBE[:200])
        self._encoded = 0
        self.chat_template: ChatTemplate | None = None
        self.chat_unavailable: str | None = None
        self._load_template(path, clock)

    def _load_template(self, path: str, clock: Clock | None) -> None:
        """Compile the template and render one plain chat with it: a template that cannot is reported here,
        once, with the reason; the sidecar serves on and routes chat traffic on load."""
        if not self.chat_template_source:
            self.chat_unavailable = "the tokenizer has no chat template"
        else:
            try:
                template = ChatTemplate(self.chat_template_source, self._specials,
                                        **({"clock": clock} if clock else {}))
                template.render([{"role": "user", "content": "hello"}])
                self.chat_template = template
            except ChatTemplateError as exc:
                self.chat_unavailable = str(exc)
        if self.chat_unavailable:
            log.warning("tokenizer %s: chat requests will route on load alone: %s", path, self.chat_unavailable)

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

    def render_chat(self, messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any] | None = None) -> str:
        """The chat as the engine renders it; `options`: the request's chat fields (vLLM's defaults when absent:
        a generation prompt, no continuation, no tools or documents; vLLM refuses a continuation with a generation
        prompt, so does this)."""
        if self.chat_template is None:
            raise ChatTemplateUnavailable("no_chat_template")
        o = dict(options or {})
        kwargs = o.get("chat_template_kwargs")
        kwargs = dict(kwargs) if isinstance(kwargs, Mapping) else {}
        if kwargs.keys() & {"chat_template", "tokenize"}:  # vLLM answers 400
            raise TokenizerError("chat_template_kwargs may not set chat_template or tokenize")
        # vLLM lets chat_template_kwargs override the request's own fields (apply_chat_template's parameters).
        for key in ("add_generation_prompt", "continue_final_message", "tools", "documents"):
            if key in kwargs:
                o[key] = kwargs.pop(key)
        try:
            return self.chat_template.render(
                messages, tools=o.get("tools"), documents=o.get("documents"),
                add_generation_prompt=bool(o.get("add_generation_prompt", True)),  # vLLM's default, even continuing
                continue_final_message=bool(o.get("continue_final_message", False)), extra=kwargs)
        except ChatTemplateError as exc:
            raise TokenizerError(str(exc)) from exc

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any] | None = None
                    ) -> list[int]:
        # vLLM tokenizes the rendered chat without adding special tokens: the template placed them.
        return self._encode_plain(self.render_chat(messages, options))


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

    async def encode_chat(self, messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any] | None = None
                          ) -> list[int]:
        if self.tokenizer.chat_template is None:  # told once at start; no thread hop to fail again
            raise ChatTemplateUnavailable("no_chat_template")
        return await self._run(self.tokenizer.encode_chat, messages, options)

    async def _run(self, fn: Any, *args: Any) -> list[int]:
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(self._pool, fn, *args), self.timeout_s)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
