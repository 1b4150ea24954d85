"""Exact, cached tokenization of long prompts that share prefixes.

For byte-level BPE tokenizers (GPT-2, Qwen, Llama-3 style), pre-tokenization never joins across a point
where a letter or digit is followed by a single space and a letter: the space starts the next word's
pre-token. Encoding the pieces between such points separately and concatenating gives the same ids as
encoding the whole text, so the pieces of a shared prefix can be cached and only the new tail encoded.

Piece boundaries are found by scanning from the start (the first safe point at or after every
`piece_chars` characters), so two prompts sharing a prefix cut it identically up to where they differ.
Exactness is not assumed: `ChunkedEncoder.self_check` compares against the whole-text encoding on load
and on a sample of live prompts; any mismatch turns the cache off for good.

A piece enters the cache on its second sighting only. Prompts that differ after a shared prefix (a question
after a system prompt, a user's own document) would otherwise fill it with pieces seen once and never again,
so under steady traffic it would grow to its bound and hold little that is shared. The pieces seen once are
remembered by hash in a fixed-size table (`DOORKEEPER_SLOTS`, allocated whole at start: its memory never grows;
a collision only delays a piece's admission).

A cached piece's ids are the list its encode returned. The tokenizer's ids are the vocabulary's shared int
objects (shared_ids.py), so such a list costs 8 bytes a token, and a hit copies references into the prompt's
list: no int object made (as an `array('i')` it cost 4 bytes a token but made a new int for every id copied
out, and those ints are what a held request kept: docs/memory.md).
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence

from loadaware.lifecycle import previewing

Encode = Callable[[str], list[int]]

DOORKEEPER_SLOTS = 1 << 16  # 512 KiB of piece hashes
# The default of --tokenizer-cache-tokens: room for ~1,300 distinct 1,500-token shared prefixes (its bytes per
# token: docs/memory.md).
MAX_CACHED_TOKENS = 2_000_000


def split_points(text: str, piece_chars: int) -> list[int]:
    """Offsets where `text` may be cut: text[p] == ' ', text[p-1] alphanumeric, text[p+1] a letter."""
    points: list[int] = []
    n = len(text)
    pos = piece_chars
    while pos < n - 1:
        p = text.find(" ", pos)
        if p < 0 or p >= n - 1:
            break
        if text[p - 1].isalnum() and text[p + 1].isalpha() and not text[p - 1].isspace():
            points.append(p)
            pos = p + piece_chars
        else:
            pos = p + 1
    return points


class ChunkedEncoder:
    def __init__(self, encode: Encode, max_cached_tokens: int = MAX_CACHED_TOKENS, piece_chars: int = 512,
                 min_chars: int = 1024) -> None:
        self._encode = encode
        self.piece_chars = piece_chars
        self.min_chars = min_chars  # below this a whole encode is as cheap as the bookkeeping
        self.max_cached_tokens = max_cached_tokens
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._cached_tokens = 0
        self._lock = threading.Lock()
        self._seen_once = array("q", bytes(8 * DOORKEEPER_SLOTS))  # hash of a piece seen once, per slot
        self.enabled = max_cached_tokens > 0  # 0: off, every prompt encoded whole
        self._last_split: tuple[str, list[str], str] = ("", [], "")
        self.hits = 0
        self.misses = 0

    def uncached_chars(self, text: str) -> int:
        """How much of `text` an encode would hand to the tokenizer (pieces not cached, and the tail): what
        it costs, told before doing it. The pieces are kept for the encode that usually follows (the same
        string objects: their hashes are computed once)."""
        if not self.enabled or len(text) < self.min_chars:
            return len(text)
        pieces, tail = self._split(text)
        cache = self._cache
        return len(tail) + sum(len(piece) for piece in pieces if piece not in cache)

    def _split(self, text: str) -> tuple[list[str], str]:
        """The cacheable pieces of `text` and its tail (the whole text when there is no cut point)."""
        last = self._last_split
        if last[0] is text:
            return last[1], last[2]
        cuts = split_points(text, self.piece_chars)
        bounds = [0, *cuts]
        pieces = [text[a:b] for a, b in zip(bounds, cuts)]
        tail = text[bounds[-1]:]
        self._last_split = (text, pieces, tail)  # one assignment: safe to read from another thread
        return pieces, tail

    def encode(self, text: str) -> list[int]:
        if not self.enabled or len(text) < self.min_chars:
            return self._encode(text)
        if previewing():
            return self._encode_read_only(text)
        pieces, tail = self._split(text)
        ids: list[int] = []
        for piece in pieces:
            with self._lock:
                cached: Sequence[int] | None = self._cache.get(piece)
                if cached is not None:
                    self._cache.move_to_end(piece)
                    self.hits += 1
            if cached is None:
                cached = self._encode(piece)
                self._remember(piece, cached)
            ids.extend(cached)
        ids.extend(self._encode(tail))  # the tail is where prompts differ: never worth caching
        return ids

    def _encode_read_only(self, text: str) -> list[int]:
        """The same ids, and the cache exactly as it was: no insertion, no recency, no hit counted."""
        cuts = split_points(text, self.piece_chars)
        bounds = [0, *cuts]
        ids: list[int] = []
        for a, b in zip(bounds, cuts):
            piece = text[a:b]
            with self._lock:
                cached = self._cache.get(piece)
            ids.extend(cached if cached is not None else self._encode(piece))
        ids.extend(self._encode(text[bounds[-1]:]))
        return ids

    def _remember(self, piece: str, ids: list[int]) -> None:
        with self._lock:
            self.misses += 1
            if piece in self._cache or not self._seen_before(piece):
                return
            self._cache[piece] = ids  # never changed after: the prompts copy from it
            self._cached_tokens += len(ids)
            while self._cached_tokens > self.max_cached_tokens and self._cache:
                _, old = self._cache.popitem(last=False)
                self._cached_tokens -= len(old)

    def _seen_before(self, piece: str) -> bool:
        """True on a piece's second sighting (then it is cached); the first one is only remembered."""
        h = hash(piece)  # computed once per string object and kept by it
        slot = h & (DOORKEEPER_SLOTS - 1)
        if self._seen_once[slot] == h:
            return True
        self._seen_once[slot] = h
        return False

    def self_check(self, text: str) -> bool:
        """Pieces vs the whole text; a mismatch disables the cache (exactness over speed)."""
        if not self.enabled or len(text) < self.min_chars:
            return self.enabled
        # Read-only: the check is no sighting. Were it one, the encode that follows a check would be each
        # checked prompt's second, and its own pieces (its unique text among them) would enter the cache: one
        # prompt in SELF_CHECK_EVERY's, until the bound (docs/memory.md, "The piece cache and the exactness check").
        ok = self._encode_read_only(text) == self._encode(text)
        if not ok:
            self.enabled = False
            with self._lock:
                self._cache.clear()
                self._cached_tokens = 0
        return ok

    @property
    def cached_tokens(self) -> int:
        return self._cached_tokens

    @property
    def cached_pieces(self) -> int:
        return len(self._cache)
