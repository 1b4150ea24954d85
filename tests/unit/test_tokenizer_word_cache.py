"""The sidecar's tokenizer bounds the word cache inside `tokenizers`: once it holds its words, new words seen
once leave no memory behind.

The library's BPE model caches every word it merges (10,000 by default, the first seen kept for good, nothing
evicted), and a long word costs kilobytes there. The sidecar resizes that cache to LIBRARY_WORD_CACHE_WORDS. Two
batches of new long words go through each tokenizer: the first fills the sidecar's bounded cache, the second must
then keep nothing, where the library's default (the contrast, which shows the measurement sees the cache) keeps
every word of both.
"""

from __future__ import annotations

import random
import string
from concurrent.futures import ThreadPoolExecutor

from tokenizers import Tokenizer

from loadaware.collector import settled_malloc_reader
from loadaware.tokenize.tokenizer import LIBRARY_WORD_CACHE_WORDS, PromptTokenizer, bound_word_cache
from testkit.paths import TINY_TOKENIZER

WORDS, LETTERS = 2_000, 200  # a batch: more than the sidecar's bound, a fifth of the library's default


def new_words(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join("".join(rng.choices(string.ascii_lowercase, k=LETTERS)) for _ in range(10))
            for _ in range(WORDS // 10)]


def kept_mib(tok: Tokenizer, texts: list[str]) -> float:
    read = settled_malloc_reader()
    assert read is not None, "glibc's mallinfo2 and malloc_trim"
    before = read()
    for text in texts:
        tok.encode(text, add_special_tokens=False)
    return (read() - before) / 2**20


def test_the_library_default_keeps_every_new_word() -> None:
    tok = Tokenizer.from_file(str(TINY_TOKENIZER / "tokenizer.json"))
    first, second = kept_mib(tok, new_words(1)), kept_mib(tok, new_words(2))
    print(f"library default: {first:.2f} then {second:.2f} MiB kept by two batches of {WORDS} new words")
    assert first > 4.0 and second > 4.0


def test_the_sidecars_tokenizer_holds_its_bound() -> None:
    assert 0 < LIBRARY_WORD_CACHE_WORDS < WORDS
    tok = PromptTokenizer(str(TINY_TOKENIZER))._tokenizer
    first, second = kept_mib(tok, new_words(1)), kept_mib(tok, new_words(2))
    print(f"PromptTokenizer ({LIBRARY_WORD_CACHE_WORDS} words): {first:.2f} then {second:.2f} MiB kept by two "
          f"batches of {WORDS} new words")
    assert second < 0.3  # the bound was reached in the first batch and held
    assert first < 8.0 * LIBRARY_WORD_CACHE_WORDS / 1024  # at most ~7 KB a 200-letter word


def test_each_thread_that_encodes_fills_a_cache_of_its_own_to_the_bound() -> None:
    """`tokenizers` (0.23) keeps the word cache per thread: another thread fills one of its own, to the same
    bound, and then holds it. The sidecar encodes on three (the event loop and the pool's two): docs/memory.md
    budgets three caches."""
    tok = PromptTokenizer(str(TINY_TOKENIZER))._tokenizer
    here = kept_mib(tok, new_words(1))
    with ThreadPoolExecutor(max_workers=1) as other:
        there = other.submit(kept_mib, tok, new_words(1)).result()  # the same words, on another thread
        again = other.submit(kept_mib, tok, new_words(2)).result()
    print(f"this thread kept {here:.2f} MiB, another thread {there:.2f} then {again:.2f} MiB")
    assert there > 0.5 * here > 0  # not the first thread's cache: the other thread kept the words again
    assert again < 0.3  # and its own cache holds its bound too


def test_bound_word_cache_fails_open_without_the_call() -> None:
    class NoCacheModel:
        pass

    class Stand:
        model = NoCacheModel()

    assert bound_word_cache(Stand(), 0) is False  # type: ignore[arg-type]
