"""A conversation is tokenized once: the token ids of a rendered chat's prefix, cached at message boundaries.

Agent sessions re-send their whole history every turn. Rendering it again is cheap; tokenizing it again from the
first character is not (and past `--tokenize-max-chars` only its head would count). So after a chat request is
encoded, the ids of its messages rendered as a closed conversation (`add_generation_prompt=False`: the text the
next turn's rendering begins with) are kept, and the next request that extends those messages encodes only the
text after them.

Keys. A chat's messages[:k] have the key d_k: a hash chained over the options that change how the template renders
(tools, documents, chat_template_kwargs, the system-merge flag), then each message's fingerprint (its strings
hashed where they lie, no serialization). An entry is stored under d_n of a request's n messages: the request's
rendering up to its last safe cut (before the generation prompt's opening token: the text the next turn's
rendering begins with), as its length in characters, a hash of that text, and its ids. A request looks up d_n,
d_{n-1}, ..., d_1 and takes the longest entry whose text is where its own rendering begins (same length, same hash:
a template that renders a message differently once it is no longer the last one, or a date that changed, is a
miss; so is a key collision).

Exactness. ids(prefix) + ids(rest) equals ids(prefix + rest) only where the tokenizer cannot merge across the cut.
A cut is taken only where the rest begins with an added (special) token that matches on the raw text and strips
nothing (no lstrip, no single_word, not normalized unless there is no normalizer, not starting with whitespace),
and where no added token straddles the cut: the tokenizer splits added tokens out before anything else, so each
side is normalized, pre-tokenized and encoded on its own either way. Chat templates put such a token at every
message boundary (<|im_start|>, <|start_header_id|>, <start_of_turn>, [INST]...); a template that does not gets no
cache hits, only exact ids. Storing, the kept prefix's ids are the request's ids less the encoding of the text
after the cut (the generation prompt), checked against their tail: no second render, no second full encode. On
top: a probe at load (a conversation grown turn by turn through the cache against whole encodes) and a whole-text
check of one cache hit in SELF_CHECK_EVERY on live requests; any mismatch turns the cache off for good
(`disabled`, in the metrics).

Bounds. At most `max_bytes` of ids (array('i'): 4 bytes a token, against ~40 for a list of ints) plus
ENTRY_BYTES per entry, and at most `max_entries` entries; least recently used first out. A conversation's turns
share one array: the entry of turn t+1 appends to the array of turn t's entry when nothing was appended since
(a branch copies), so a whole session costs about its final length once, not the sum of its turns.

Explain (`previewing()`) reads the cache and never changes it: no insertion, no recency, no counts.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from loadaware.lifecycle import previewing
from loadaware.tokenize.tokenizer import HEAD_SLACK_TOKENS, MERGE_INLINE_SYSTEM, PromptTokenizer, TokenHead

log = logging.getLogger(__name__)

BYTES_PER_TOKEN = 4  # array('i')
# One entry's own cost beside its ids: its key (a 64-bit int), the entry object with its two ints, the
# OrderedDict's slot and links (tracemalloc: ~230 B).
ENTRY_BYTES = 256
DEFAULT_MB = 32  # ~8M tokens: ~150 sessions of 220 KB (~55k tokens) each
MiB = 1 << 20
DEFAULT_MAX_ENTRIES = 16_384  # at most 4 MiB of entries' own cost
SELF_CHECK_EVERY = 64
TAIL_WINDOW = 4096  # a request's last cut is looked for in its rendering's last characters (the generation prompt)
RENDER_OPTIONS = ("tools", "documents", "chat_template_kwargs", MERGE_INLINE_SYSTEM)


def fingerprint(value: Any) -> int:
    """A hash of a JSON value, reading each string once where it lies (no serialization: a 200 KB conversation
    costs ~0.2 ms). Not canonical (a dict's key order counts): a client that reorders keys only misses."""
    if isinstance(value, str):
        return hash(value)
    if isinstance(value, Mapping):
        return hash(("{", *((k, fingerprint(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return hash(("[", *(fingerprint(v) for v in value)))
    return hash((type(value).__name__, value if isinstance(value, (int, float, bool)) or value is None
                 else repr(value)))


def digests(messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any] | None) -> list[int]:
    """d_1..d_n: the key of messages[:k] under the options that change the rendering (index k-1). A collision
    of keys costs nothing but a look at the entry: its text must also be where the request's rendering begins."""
    o = options or {}
    d = fingerprint([o.get(k) for k in RENDER_OPTIONS])
    out = []
    for message in messages:
        d = hash((d, fingerprint(message)))
        out.append(d)
    return out


class BoundaryRule:
    """Where a rendered chat may be cut and its two sides encoded apart (see the module's docstring)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        added = list(tokenizer.get_added_tokens_decoder().values())
        plain = tokenizer.normalizer is None
        self.starts = tuple(sorted(
            t.content for t in added if t.content and not t.lstrip and not t.single_word
            and (plain or not t.normalized) and not t.content[0].isspace()))
        self.tokens = tuple(t.content for t in added if t.content)
        self.longest = max((len(t) for t in self.tokens), default=0)
        self._firsts = tuple({t[0] for t in self.starts})

    def last_cut(self, text: str, after: int) -> int | None:
        """The last safe cut of `text` past `after`, within its last TAIL_WINDOW characters (a chat's rendering
        ends with a message's or the generation prompt's few tokens after its last cut)."""
        floor = max(after + 1, len(text) - TAIL_WINDOW)
        end = len(text)
        while True:
            at = max((text.rfind(c, floor, end) for c in self._firsts), default=-1)
            if at < floor:
                return None
            if self.safe(text, at):
                return at
            end = at

    def safe(self, text: str, at: int) -> bool:
        if at >= len(text):
            return True  # nothing after: the prefix is the whole text
        if not self.starts or not text.startswith(self.starts, at):
            return False
        lo = max(0, at - self.longest + 1)
        window = text[lo:at + self.longest]
        for token in self.tokens:  # an added token across the cut would be split apart by it
            i = window.find(token)
            while i >= 0 and lo + i < at:
                if lo + i + len(token) > at:
                    return False
                i = window.find(token, i + 1)
        return True


@dataclass(slots=True, eq=False)
class _Run:
    """Token ids shared by the entries of one conversation's turns (each a prefix of it)."""

    ids: array[int]
    refs: int = 0


@dataclass(slots=True, eq=False)
class _Entry:
    run: _Run
    tokens: int  # this entry's ids: run.ids[:tokens]
    chars: int  # the closed rendering's length
    text_hash: int


@dataclass(slots=True)
class Hit:
    entry: _Entry
    ids: list[int]
    check: bool = False  # this hit's result is compared with a whole encode


@dataclass(slots=True)
class Prepared:
    """A chat request rendered and looked up: what is left to encode is `text[start:]`."""

    messages: Sequence[Mapping[str, Any]]
    options: Mapping[str, Any] | None
    text: str
    keys: list[int]
    hit: Hit | None = None
    start: int = field(default=0)

    @property
    def new_text(self) -> str:
        return self.text[self.start:]

    @property
    def new_chars(self) -> int:
        return len(self.text) - self.start


class ConversationCache:
    """Bounded LRU of closed-conversation prefixes and their ids; thread-safe (the event loop and the workers)."""

    def __init__(self, max_bytes: int, max_entries: int = DEFAULT_MAX_ENTRIES,
                 shared: Callable[[Sequence[int]], list[int]] = list) -> None:
        self.max_bytes = max_bytes
        self._shared = shared  # a hit's ids as a prompt's list: the tokenizer's shared ints (shared_ids.py)
        self.max_entries = max_entries
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0  # live runs' ids + ENTRY_BYTES per entry
        self.enabled = True
        self.hits = 0
        self.misses = 0
        self.tokens_reused = 0
        self.disabled = 0  # 1 once a self-check failed

    def __len__(self) -> int:
        return len(self._entries)

    def counts(self) -> dict[str, int]:
        """The metrics' values (int reads: safe from any thread)."""
        return {"hits": self.hits, "misses": self.misses, "tokens_reused": self.tokens_reused,
                "entries": len(self._entries), "bytes": self.bytes, "disabled": self.disabled}

    def lookup(self, keys: Sequence[int], text: str, rule: BoundaryRule) -> Hit | None:
        """The longest cached messages[:k] whose closed rendering begins `text` at a safe cut."""
        if not self.enabled:
            return None
        preview = previewing()
        for k in range(len(keys) - 1, -1, -1):
            with self._lock:
                entry = self._entries.get(keys[k])
            if entry is None or entry.chars > len(text) or hash(text[:entry.chars]) != entry.text_hash:
                continue
            if not rule.safe(text, entry.chars):
                continue
            with self._lock:
                run_ids = entry.run.ids[:entry.tokens]  # a copy of the array: a later turn may extend it
                if not preview:
                    if keys[k] in self._entries:
                        self._entries.move_to_end(keys[k])
                    self.hits += 1
                    self.tokens_reused += entry.tokens
                check = not preview and self.hits % SELF_CHECK_EVERY == 0
            return Hit(entry, self._shared(run_ids), check=check)
        if not preview:
            with self._lock:
                self.misses += 1
        return None

    def has(self, key: int, chars: int) -> bool:
        with self._lock:
            entry = self._entries.get(key)
            return entry is not None and entry.chars == chars

    def store(self, key: int, chars: int, text_hash: int, base: _Entry | None, new_ids: Sequence[int]) -> None:
        """Keep messages[:n]'s closed rendering: `base`'s ids (the hit it extends, if any) then `new_ids`."""
        tokens = (base.tokens if base else 0) + len(new_ids)
        if tokens * BYTES_PER_TOKEN + ENTRY_BYTES > self.max_bytes:
            return
        with self._lock:
            if not self.enabled:
                return
            old = self._entries.pop(key, None)
            if old is not None:
                self._release(old)
            run = self._run_for(base, new_ids)
            run.refs += 1
            self._entries[key] = _Entry(run, tokens, chars, text_hash)
            self.bytes += ENTRY_BYTES
            self._evict()

    def _run_for(self, base: _Entry | None, new_ids: Sequence[int]) -> _Run:
        """(under the lock) `base`'s run appended to in place when nothing was appended since, else a copy."""
        if base is not None and len(base.run.ids) == base.tokens:
            run = base.run
            if run.refs == 0:  # evicted meanwhile: counted again
                self.bytes += len(run.ids) * BYTES_PER_TOKEN
            run.ids.extend(new_ids)
            self.bytes += len(new_ids) * BYTES_PER_TOKEN
            return run
        ids = array("i", base.run.ids[:base.tokens]) if base is not None else array("i")
        ids.extend(new_ids)
        self.bytes += len(ids) * BYTES_PER_TOKEN
        return _Run(ids)

    def _release(self, entry: _Entry) -> None:
        self.bytes -= ENTRY_BYTES
        entry.run.refs -= 1
        if entry.run.refs == 0:
            self.bytes -= len(entry.run.ids) * BYTES_PER_TOKEN

    def _evict(self) -> None:
        while self._entries and (self.bytes > self.max_bytes or len(self._entries) > self.max_entries):
            _, entry = self._entries.popitem(last=False)
            self._release(entry)

    def disable(self) -> None:
        with self._lock:
            self.enabled = False
            self.disabled = 1
            self._entries.clear()
            self.bytes = 0

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0
            self.hits = self.misses = self.tokens_reused = 0


# The load-time probe: turns with whitespace at their edges, newlines, digits and non-ASCII text; each user turn
# ends where a BPE would merge with the next turn's start ("th|e", "a |b", "in|g", "12|34") if nothing came between.
_PROBE_TEXTS = ("Hello there!", "  Indented reply,\nwith a second line th", "e naïve café — 3.14 ok?\n\n12",
                "34\tTabbed\tquestion? a ", "b Sure: 1) one 2) two.\n", "日本語のテキスト、そして English. in", "g ",
                "end")


class ConversationTokens:
    """The chat path of a PromptTokenizer through the conversation cache: render, look up, encode the rest."""

    def __init__(self, tokenizer: PromptTokenizer, max_bytes: int = DEFAULT_MB * MiB,
                 max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.tokenizer = tokenizer
        self.cache = ConversationCache(max_bytes, max_entries, shared=tokenizer.shared)
        self.rule = BoundaryRule(tokenizer.backend)
        if not self.rule.starts:
            log.info("conversation cache: the tokenizer has no added token to cut at; every chat encoded whole")
        if tokenizer.chat_template is not None:
            self.probe()

    @property
    def enabled(self) -> bool:
        return self.cache.enabled

    def prepare(self, messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any] | None) -> Prepared:
        text = self.tokenizer.render_chat(messages, options)
        keys = digests(messages, options)
        prep = Prepared(messages, options, text, keys)
        prep.hit = self.cache.lookup(keys, text, self.rule)
        if prep.hit is not None:
            prep.start = prep.hit.entry.chars
        return prep

    def encode(self, messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any] | None = None,
               max_chars: int = 0) -> list[int]:
        """The whole path at once (in a worker thread, or for a caller without a loop)."""
        prep = self.prepare(messages, options)
        if max_chars and len(prep.new_text) > max_chars:
            return self.head(prep, max_chars)
        return self.finish(prep)

    def finish(self, prep: Prepared) -> list[int]:
        """Encode the text after the cached prefix; check (sampled), then keep this request's closed rendering."""
        new_ids = self.tokenizer.encode_rendered(prep.new_text)
        hit = prep.hit
        ids = new_ids
        if hit is not None:
            ids = hit.ids
            ids.extend(new_ids)
        if previewing():
            return ids
        if hit is not None and hit.check:
            whole = self.tokenizer.encode_exact(prep.text)
            if whole != ids:
                log.error("conversation cache: a cached prefix's ids differ from the whole text's; cache off")
                self.cache.disable()
                return whole
        self._store(prep, new_ids, ids)
        return ids

    def head(self, prep: Prepared, max_chars: int) -> TokenHead:
        """Past `max_chars` of new text: the cached prefix and the new text's head (less HEAD_SLACK_TOKENS)."""
        head_ids = self.tokenizer.encode_rendered(prep.text[prep.start:prep.start + max_chars])
        kept = head_ids[:max(0, len(head_ids) - HEAD_SLACK_TOKENS)]
        cached = prep.hit.ids if prep.hit is not None else []
        total = len(cached) + max(len(kept), round(len(head_ids) * prep.new_chars / max(1, max_chars)))
        return TokenHead(cached + kept, total)

    def _store(self, prep: Prepared, new_ids: list[int], ids: list[int]) -> None:
        """Keep the request's rendering up to its last safe cut (before the generation prompt's or the final
        message's opening token: what the next turn's rendering begins with), under its messages' key. Its ids
        are the request's less the encoding of the text after the cut, checked against their tail."""
        if not self.cache.enabled or not prep.keys:
            return
        text = prep.text
        cut = self.rule.last_cut(text, prep.start)
        if cut is None or self.cache.has(prep.keys[-1], cut):
            return
        tail_ids = self.tokenizer.encode_exact(text[cut:])
        if len(tail_ids) > len(new_ids) or ids[len(ids) - len(tail_ids):] != tail_ids:
            return
        base = prep.hit.entry if prep.hit is not None else None
        self.cache.store(prep.keys[-1], cut, hash(text[:cut]), base, new_ids[:len(new_ids) - len(tail_ids)])

    def probe(self) -> bool:
        """At load: a conversation grown turn by turn through the cache gives the whole texts' ids, else off."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": _PROBE_TEXTS[0]}]
        try:
            for turn, text in enumerate(_PROBE_TEXTS[1:]):
                messages = [*messages, {"role": "user" if turn % 2 == 0 else "assistant", "content": text}]
                if messages[-1]["role"] == "assistant":
                    continue
                got = self.encode(messages)
                if got != self.tokenizer.encode_exact(self.tokenizer.render_chat(messages)):
                    log.error("conversation cache: the load-time probe found ids that differ; cache off")
                    self.cache.disable()
                    return False
        except Exception as exc:  # noqa: BLE001 - a template that refuses the probe: live self-checks remain
            log.info("conversation cache: the load-time probe did not render (%s)", exc)
        self.cache.clear()
        return True
