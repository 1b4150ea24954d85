"""The piece cache must give exactly the whole-text token ids, or switch itself off."""

from __future__ import annotations

import random

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from loadaware.tokenize.pieces import ChunkedEncoder, split_points
from loadaware.tokenize.tokenizer import (
    INLINE_CHARS,
    INLINE_RENDER_CHARS,
    SELF_CHECK_EVERY,
    AsyncTokenizer,
    PromptTokenizer,
    text_chars,
)

TINY = "sim/assets/tiny-model"
WORDS = ["the", "engine", "cache", "naïve", "café", "x1", "42", "it's", "end.", "(a)", "—", "\n", "\t", "  ", "ok?"]


def random_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def test_split_points_are_only_word_starts() -> None:
    text = "alpha beta  gamma, delta 12 epsilon\nzeta eta"
    for p in split_points(text, 1):
        assert text[p] == " " and text[p - 1].isalnum() and text[p + 1].isalpha()
    assert split_points("short", 100) == []


def test_pieces_equal_whole_encoding_on_varied_text() -> None:
    tok = PromptTokenizer(TINY)
    plain = tok._plain
    encoder = ChunkedEncoder(plain, piece_chars=64, min_chars=0)
    rng = random.Random(5)
    shared = random_text(rng, 600)
    for i in range(40):
        text = shared + " " + random_text(rng, rng.randint(1, 80)) if i % 2 else random_text(rng, 700)
        assert encoder.encode(text) == plain(text), i
    assert encoder.hits > 0 and encoder.enabled


def test_cache_is_bounded() -> None:
    encoder = ChunkedEncoder(lambda s: [len(w) for w in s.split()], max_cached_tokens=50, piece_chars=20, min_chars=0)
    rng = random.Random(1)
    for _ in range(30):
        encoder.encode(" ".join(rng.choice(["alpha", "beta", "gamma"]) + str(rng.randint(0, 9)) for _ in range(60)))
    assert encoder.cached_tokens <= 50


def test_a_piece_seen_once_is_not_cached() -> None:
    """Prompts that share nothing after a common prefix must not fill the cache with their unique pieces."""
    encoder = ChunkedEncoder(lambda s: [len(w) for w in s.split()], piece_chars=20, min_chars=0)
    rng = random.Random(3)
    shared = " ".join(f"shared{i}" for i in range(40))
    for _ in range(200):
        unique = " ".join(f"word{rng.randrange(10**9)}" for _ in range(30))
        text = f"{shared} {unique} end"
        assert encoder.encode(text) == [len(w) for w in text.split()]
    shared_pieces = sum(1 for piece in encoder._cache if piece in shared)
    assert shared_pieces == len(encoder._cache) > 0  # only the shared prefix's pieces were admitted
    assert encoder.hits > 0


def test_the_exactness_check_is_no_sighting() -> None:
    """The live exactness check (one prompt in SELF_CHECK_EVERY) encodes the prompt before its own encode: were
    that a sighting, the prompt's unique pieces would be cached on the encode that follows, a cache that fills
    with text seen once, 1 prompt in 64's, until its bound."""
    tok = PromptTokenizer(TINY)
    prefix = random_text(random.Random(4), 400)
    for i in range(3 * SELF_CHECK_EVERY):
        unique = " ".join(f"word{i}x{j}" for j in range(150))  # a piece of its own and the tail
        tok.encode_prompt(f"{prefix} {unique} end")
    assert tok.pieces.enabled and tok.pieces.hits > 0
    assert all("word" not in piece for piece in tok.pieces._cache)


def test_a_non_compositional_tokenizer_switches_the_cache_off() -> None:
    # A tokenizer whose output for a piece depends on where the piece sits (here: a marker on the first
    # word, as a BOS-adding post-processor or a "first"-only prefix space would) must not be cut up.
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(["alpha beta gamma delta"] * 10,
                            trainer=trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    plain = lambda s: [99] + tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    encoder = ChunkedEncoder(plain, piece_chars=10, min_chars=0)
    text = " ".join(["alpha", "beta", "gamma", "delta"] * 50)
    assert encoder.self_check(text) is False
    assert encoder.enabled is False
    assert encoder.encode(text) == plain(text)


def test_prompt_tokenizer_uses_pieces_for_long_shared_prompts() -> None:
    tok = PromptTokenizer(TINY)
    assert tok.pieces.enabled
    prefix = random_text(random.Random(9), 1500)
    for i in range(5):
        text = f"{prefix} question {i}?"
        assert tok.encode_prompt(text) == tok._tokenizer.encode(text, add_special_tokens=True).ids
    assert tok.pieces.hits > 0
    chat = [{"role": "system", "content": prefix}, {"role": "user", "content": "hi"}]
    assert tok.encode_chat(chat) == tok._tokenizer.encode(tok.render_chat(chat), add_special_tokens=False).ids


async def test_cached_prompts_encode_on_the_event_loop_the_rest_in_a_thread() -> None:
    tok = AsyncTokenizer(PromptTokenizer(TINY), timeout_s=5.0)
    inner = tok.tokenizer
    prefix = random_text(random.Random(11), 1500)  # ~8 KB: over INLINE_CHARS when nothing is cached
    assert len(prefix) > 2 * INLINE_CHARS
    first = f"{prefix} question 0?"
    assert inner.pieces.uncached_chars(first) == len(first) and not inner.cheap(first)
    assert await tok.encode_prompt(first) == inner._tokenizer.encode(first, add_special_tokens=True).ids
    assert tok.inline == 0  # the cold prompt went to the pool
    again = f"{prefix} question again?"  # a piece is cached on its second sighting: this one is cold too
    assert inner.pieces.uncached_chars(again) == len(again)
    assert await tok.encode_prompt(again) == inner._tokenizer.encode(again, add_special_tokens=True).ids
    assert tok.inline == 0
    second = f"{prefix} question 1?"
    assert inner.pieces.uncached_chars(second) < 600  # only the tail is new
    assert await tok.encode_prompt(second) == inner._tokenizer.encode(second, add_special_tokens=True).ids
    assert tok.inline == 1
    chat = [{"role": "system", "content": prefix}, {"role": "user", "content": "hi"}]
    await tok.encode_chat(chat)  # rendered on the loop; its pieces are cached now
    assert await tok.encode_chat(chat) == inner._tokenizer.encode(inner.render_chat(chat),
                                                                  add_special_tokens=False).ids
    assert tok.inline >= 2
    # A chat with tools is rendered in the pool whatever its size; so is the periodic exactness check.
    assert text_chars(chat, {"tools": [{"type": "function"}]}) > INLINE_RENDER_CHARS
    assert text_chars([{"role": "assistant", "content": None, "tool_calls": []}], None) > INLINE_RENDER_CHARS
    inner._encoded = SELF_CHECK_EVERY - 1
    assert not inner.cheap("short")
    tok.close()
