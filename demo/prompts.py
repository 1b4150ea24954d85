"""The demo's prompts: long shared prefixes from the tiny model's vocabulary, aligned to LMCache chunks."""

from __future__ import annotations

import random
from collections.abc import Callable

from sim.lmcache_chunks import LMCACHE_CHUNK_SIZE
from sim.make_tokenizer import WORDS
from sim.tokenization import SimTokenizer

MODEL = "tiny-model"
CHUNK = LMCACHE_CHUNK_SIZE  # LMCache credits whole 256-token chunks only


def prefix_text(tok: SimTokenizer, seed: int, target_tokens: int) -> str:
    """Words until the text is about `target_tokens` tokens long (the tiny vocabulary is ~1 token/word)."""
    rng = random.Random(seed)
    text = f"Document {seed}."
    while len(tok.encode_prompt(text)) < target_tokens:
        text += " " + " ".join(rng.choice(WORDS) for _ in range(32))
    return text


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def chunk_aligned(tok: SimTokenizer, text: str, encode_pair: Callable[[str], tuple[list[int], list[int]]]) -> str:
    """Pad `text` with one-token words until the token prefix two requests built from it share ends on a
    256-token chunk boundary. LMCache never matches a partial chunk, so this makes the demo's benefit ~1
    instead of (whole chunks)/(prompt)."""
    base = tok.encode_prompt("x")
    fillers = [w for w in WORDS if len(tok.encode_prompt("x " + w)) == len(base) + 1] or ["the"]
    rng = random.Random(len(text))
    for _ in range(2 * CHUNK):
        shared = common_prefix(*encode_pair(text))
        if shared and shared % CHUNK == 0:
            return text
        text += " " + rng.choice(fillers)
    return text


def summarize(text: str, n_tokens: int) -> str:
    return f"<{n_tokens} tokens: {text[:32]!r}...{text[-30:]!r}>"
