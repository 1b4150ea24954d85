"""Tokenize exactly as the engine does, off the event loop.

Completions: `encode(prompt, add_special_tokens=True)`. Chat: the tokenizer's chat template rendered
first (with the generation prompt), then `encode(text, add_special_tokens=False)`: what vLLM does, and
what a router that only tokenizes `prompt` gets wrong (it never matches chat traffic).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from loadaware.lifecycle import previewing
from loadaware.tokenize.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    Clock,
    merge_inline_system,
    read_tokenizer_config,
)
from loadaware.tokenize.pieces import MAX_CACHED_TOKENS, ChunkedEncoder
from loadaware.tokenize.shared_ids import SharedIds

if TYPE_CHECKING:
    from loadaware.tokenize.conversation import ConversationTokens

log = logging.getLogger(__name__)

# A load-time exactness probe for the piece cache: words, digits, punctuation, newlines, non-ASCII.
_PROBE = " ".join(
    f"Paragraph {i}: the quick brown fox, naïve café #{i * 37} jumps over 3 lazy dogs; it's "
    f"done\n\n  - item {i}.\tEnd of line {i} — ok?" for i in range(120))


# At most this many characters handed to the tokenizer run on the event loop (~0.5 ms of encoding); more go to
# a worker thread. A chat whose messages hold more text than INLINE_RENDER_CHARS is rendered there too.
INLINE_CHARS = 2048
INLINE_RENDER_CHARS = 64 * 1024
MIN_TIMED_CHARS = 4096  # shorter encodes are dominated by fixed costs: their time says little per character
SELF_CHECK_EVERY = 64
# `tokenizers`' models keep a cache of their own: every word they merged, up to 10,000 by default, the first
# seen kept for the process's life. A word of up to 255 bytes costs kilobytes there, so the default's worst case
# is tens of MiB outside any budget, filled for hours by words seen once. The piece cache (pieces.py) is the
# sidecar's cache; the library's serves only text that one missed, and its first thousand words (the common
# ones) save as much there as ten thousand: it fills in minutes and holds at most a few MiB.
LIBRARY_WORD_CACHE_WORDS = 1024


MERGE_INLINE_SYSTEM = "merge_inline_system"  # an option key: the request came to vLLM's Messages endpoint
PLAIN_MESSAGE_KEYS = frozenset({"role", "content", "name"})
TOO_MUCH = INLINE_RENDER_CHARS + 1


def text_chars(messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any] | None) -> int:
    """The text a chat carries (string contents and text parts). Anything else (tools, tool calls, other
    parts) counts as too much to render on the event loop: not worth guessing its cost."""
    if options and any(options.get(k) for k in ("tools", "documents", "chat_template_kwargs")):
        return TOO_MUCH
    total = 0
    for message in messages:
        if not isinstance(message, Mapping) or not message.keys() <= PLAIN_MESSAGE_KEYS:
            return TOO_MUCH
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, Mapping) else None
                if not isinstance(text, str):
                    return TOO_MUCH
                total += len(text)
        else:
            return TOO_MUCH
    return total


class TokenizerError(Exception):
    """The prompt could not be tokenized (bad template input, missing template, ...)."""


class ChatTemplateUnavailable(LookupError):
    """The tokenizer has no chat template that renders (told once at start): chat traffic routes on load."""


def bound_word_cache(tokenizer: Tokenizer, words: int) -> bool:
    """Resize the model's own word cache to `words` (0: none); False when this `tokenizers` cannot (the model
    has no such cache, or the library lacks the call): the tokenizer works the same, only its cache stays."""
    resize = getattr(tokenizer.model, "_resize_cache", None)
    if resize is None:
        return False
    try:
        resize(words)
    except Exception:  # noqa: BLE001 - any failure leaves the library's default, never a tokenizer less
        return False
    return True


def id_space(tokenizer: Tokenizer) -> int:
    """One past the largest id the tokenizer can produce: added tokens may sit past the model's vocabulary, with
    gaps, so the count of tokens is not it."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1


class PromptTokenizer:
    def __init__(self, path: str, clock: Clock | None = None, max_cached_tokens: int = MAX_CACHED_TOKENS) -> None:
        folder, file = (path, os.path.join(path, "tokenizer.json")) if os.path.isdir(path) else \
            (os.path.dirname(path), path)
        self._tokenizer = Tokenizer.from_file(file)
        if not bound_word_cache(self._tokenizer, LIBRARY_WORD_CACHE_WORDS):
            log.info("tokenizer %s: its model's word cache could not be resized; it keeps the library's default",
                     path)
        self.chat_template_source, self._specials = read_tokenizer_config(folder)
        # every id handed out is the vocabulary's shared int object (shared_ids.py: no int made per token)
        self.shared = SharedIds(id_space(self._tokenizer))
        self._plain = lambda text: self.shared(self._tokenizer.encode(text, add_special_tokens=False).ids)
        self.pieces = ChunkedEncoder(self._plain, max_cached_tokens=max_cached_tokens)
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

    def cheap(self, text: str, chat: bool = False, budget: int = INLINE_CHARS) -> bool:
        """Whether encoding `text` costs little enough to run on the event loop (at most `budget` characters
        handed to the tokenizer; 2,048 are ~0.5 ms): a thread hop costs more CPU than a cached prompt's encode
        (`make bench`, case 9). The periodic exactness check encodes the whole text: never inline."""
        if budget <= 0 or (self._encoded + 1) % SELF_CHECK_EVERY == 0:
            return False
        if len(text) <= budget:
            return True
        if not chat and not self._specials_noop:
            return False  # a whole encode, no piece cache
        return self.pieces.uncached_chars(text) <= budget

    def _encode_plain(self, text: str) -> list[int]:
        if previewing():  # Explain: the same ids, no exactness check, no count
            return self.pieces.encode(text)
        self._encoded += 1
        if self._encoded % SELF_CHECK_EVERY == 0:  # keep checking exactness on live prompts, at ~1/64 of a full encode
            self.pieces.self_check(text)
        return self.pieces.encode(text)

    def encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self._specials_noop:
                return self._encode_plain(prompt)
            return self.shared(self._tokenizer.encode(prompt, add_special_tokens=True).ids)
        return list(prompt)  # pre-tokenized prompts go to the engine as they are

    @property
    def backend(self) -> Tokenizer:
        """The `tokenizers` Tokenizer itself (its added tokens tell where a rendered chat may be cut)."""
        return self._tokenizer

    def encode_exact(self, text: str) -> list[int]:
        """`text` encoded whole, as vLLM encodes a rendered chat: no cache, no count (the caches' checks)."""
        return self._plain(text)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any] | None = None) -> str:
        """The chat as the engine renders it; `options`: the request's chat fields (vLLM's defaults when absent:
        a generation prompt, no continuation, no tools or documents; vLLM refuses a continuation with a generation
        prompt, so does this). `options[MERGE_INLINE_SYSTEM]` (set for Anthropic Messages requests): with a
        template that requires system-first ordering, the system messages are merged as vLLM's Messages endpoint
        merges them; the key never reaches the template."""
        if self.chat_template is None:
            raise ChatTemplateUnavailable("no_chat_template")
        o = dict(options or {})
        if o.pop(MERGE_INLINE_SYSTEM, False) and self.chat_template.requires_system_first:
            messages = merge_inline_system(messages)
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
        return self.encode_rendered(self.render_chat(messages, options))

    def encode_rendered(self, text: str) -> list[int]:
        # vLLM tokenizes the rendered chat without adding special tokens: the template placed them.
        return self._encode_plain(text)


class TokenHead(list[int]):
    """The token ids of a prompt's first `--tokenize-max-chars` characters, less the last HEAD_SLACK_TOKENS (the
    cut may split a word the whole prompt's tokenization keeps together), with `total`: the whole prompt's
    length in tokens, estimated from the head's tokens per character. Prefix caches can match only the head."""

    __slots__ = ("total",)

    def __init__(self, ids: Sequence[int], total: int) -> None:
        super().__init__(ids)
        self.total = total


HEAD_SLACK_TOKENS = 16  # one block: a pre-tokenizer splits at most a word there, far shorter


class TokenizerBusy(TimeoutError):
    """The worker threads have more queued than they can finish within the time box: not queued at all."""


class AsyncTokenizer:
    """Runs a PromptTokenizer on the event loop when the work is small (a prompt whose prefix pieces are
    cached: tens of µs, less than a thread hop costs), else in worker threads, time-boxed: the event loop
    never waits on long CPU work.

    Long prompts: past `max_chars` only the head is tokenized (TokenHead). Backlog: the characters queued for
    the threads are counted, and the seconds a character costs learned (an average over recent encodes); a
    request whose encode would start later than the time box allows is not queued (TokenizerBusy, at once)
    instead of waiting the whole time box for a time-out."""

    def __init__(self, tokenizer: PromptTokenizer, timeout_s: float, threads: int = 2,
                 inline_chars: int = INLINE_CHARS, max_chars: int = 0,
                 conversations: ConversationTokens | None = None) -> None:
        self.tokenizer = tokenizer
        self.conversations = conversations  # the conversation cache (tokenize/conversation.py); None: off
        self.timeout_s = timeout_s
        self.threads = threads
        self.inline_chars = inline_chars  # 0: every encode in a worker thread
        self.max_chars = max_chars  # 0: every prompt whole
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tokenize")
        self.inline = 0  # encodes done on the event loop (the rest went to the pool)
        self.heads = 0  # prompts tokenized up to max_chars only
        self.busy = 0  # encodes not queued: the backlog would not start them in time
        self._queued_chars = 0
        self._s_per_char = 0.0  # learned; 0 until the first threaded encode finishes

    async def encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        if self.max_chars and len(prompt) > self.max_chars:
            return await self._head(self.tokenizer.encode_prompt, prompt)
        if self.tokenizer.cheap(prompt, budget=self.inline_chars):
            if not previewing():
                self.inline += 1
            return self.tokenizer.encode_prompt(prompt)
        return await self._run(self.tokenizer.encode_prompt, prompt)

    async def _head(self, encode: Any, text: str) -> TokenHead:
        head = text[:self.max_chars]
        ids = await self._run(encode, head)
        kept = ids[:max(0, len(ids) - HEAD_SLACK_TOKENS)]
        if not previewing():
            self.heads += 1
        return TokenHead(kept, max(len(kept), round(len(ids) * len(text) / max(1, len(head)))))

    async def encode_chat(self, messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any] | None = None
                          ) -> list[int]:
        if self.tokenizer.chat_template is None:  # told once at start; no thread hop to fail again
            raise ChatTemplateUnavailable("no_chat_template")
        conversations = self.conversations
        if conversations is not None and conversations.enabled:
            return await self._encode_conversation(conversations, messages, options)
        if not self.inline_chars or text_chars(messages, options) > INLINE_RENDER_CHARS:
            return await self._run(self.tokenizer.encode_chat, messages, options)
        text = self.tokenizer.render_chat(messages, options)  # a short chat renders in tens of µs
        if self.max_chars and len(text) > self.max_chars:
            return await self._head(self.tokenizer.encode_rendered, text)
        if self.tokenizer.cheap(text, chat=True, budget=self.inline_chars):
            if not previewing():
                self.inline += 1
            return self.tokenizer.encode_rendered(text)
        return await self._run(self.tokenizer.encode_rendered, text)

    async def _encode_conversation(self, conversations: ConversationTokens, messages: Sequence[Mapping[str, Any]],
                                   options: Mapping[str, Any] | None) -> list[int]:
        """Through the conversation cache: only the text after the cached prefix is encoded, on the event loop
        when it is small (and the chat small enough to render there), else in a worker thread; past `max_chars`
        of new text, the cached prefix and the new text's head (TokenHead)."""
        if not self.inline_chars or text_chars(messages, options) > INLINE_RENDER_CHARS:
            ids = await self._run(conversations.encode, messages, options, self.max_chars)
        else:
            prep = conversations.prepare(messages, options)
            if self.max_chars and prep.new_chars > self.max_chars:
                ids = await self._run(conversations.head, prep, self.max_chars)
            elif (prep.hit is None or not prep.hit.check) and \
                    self.tokenizer.cheap(prep.new_text, chat=True, budget=self.inline_chars):
                if not previewing():
                    self.inline += 1
                return conversations.finish(prep)
            else:
                ids = await self._run(conversations.finish, prep)
        if isinstance(ids, TokenHead) and not previewing():
            self.heads += 1
        return ids

    async def _run(self, fn: Any, *args: Any) -> list[int]:
        chars = _chars(args)
        # The backlog's wait (every queued character at the learned cost, spread over the threads) plus this
        # encode: past the time box, queueing it would only end in a time-out the request waits for.
        if self._s_per_char and (self._queued_chars / self.threads + chars) * self._s_per_char > self.timeout_s:
            if not previewing():
                self.busy += 1
            raise TokenizerBusy("tokenizer_busy")
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # the worker sees the caller's context (a preview stays one)
        self._queued_chars += chars
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._pool, context.run, self._timed, fn, chars,
                                                               *args), self.timeout_s)
        finally:
            self._queued_chars -= chars

    def _timed(self, fn: Any, chars: int, *args: Any) -> list[int]:
        """(in a worker thread) `fn(*args)`, its cost per character folded into the learned average."""
        started = time.perf_counter()
        out: list[int] = fn(*args)
        if chars >= MIN_TIMED_CHARS:
            cost = (time.perf_counter() - started) / chars
            # a float store is atomic under the GIL; the average forgets slowly (1/8 a sample)
            self._s_per_char = cost if not self._s_per_char else self._s_per_char + (cost - self._s_per_char) / 8
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _chars(args: tuple[Any, ...]) -> int:
    """The characters an encode call will read: its text argument's length (a chat's is estimated later)."""
    first = args[0] if args else ""
    if isinstance(first, str):
        return len(first)
    return getattr(first, "new_chars", 0)  # a prepared conversation: the text left to encode
