"""The conversation cache (loadaware/tokenize/conversation.py): ids through it equal the whole rendering's ids, turn by
turn, on every template in tests/fixtures/chat_templates and on sim/assets/tiny-model; its bounds hold; Explain
does not change it; past --tokenize-max-chars the cached turns count in full; a failed exactness check turns it off.
"""

from __future__ import annotations

import itertools
import json
import random
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer

from loadaware.config import Settings
from loadaware.lifecycle import preview
from loadaware.tokenize import conversation as conv_module
from loadaware.tokenize.conversation import (
    DEFAULT_MB,
    BoundaryRule,
    ConversationCache,
    ConversationTokens,
    digests,
)
from loadaware.tokenize.tokenizer import AsyncTokenizer, PromptTokenizer, TokenHead, TokenizerError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
TINY = Path(__file__).resolve().parents[2] / "sim" / "assets" / "tiny-model"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
WORDS = ("the", "quick", "naïve", "café", "日本語", "— ok?", "x=1;", "\n", "\n\n", "  ", "\t", "Ünïcödé", "🙂",
         "<|im_start|>", "<|im_end|>", "[INST]", "<start_of_turn>", "<|eot_id|>", "end", "ing", "!", "12345", "é")


def _fixture_names() -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.json"))


def _folder(name: str, tmp: Path) -> Path:
    """As tests/unit/test_chat_template_golden.py loads a fixture: the tiny tokenizer with its control tokens."""
    if name == "tiny-model":
        return TINY
    fx = json.loads((FIXTURES / f"{name}.json").read_text())
    tok = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in fx["control_tokens"]])
    tok.save(str(tmp / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": fx["chat_template"],
              **fx["special_tokens"]}
    (tmp / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return tmp


def _text(rng: random.Random) -> str:
    if rng.random() < 0.1:
        return ""
    n = rng.choice((1, 3, 12, 60, 400 if rng.random() < 0.2 else 30))
    sep = rng.choice(("", " ", " ", "\n"))
    text = sep.join(rng.choice(WORDS) for _ in range(n))
    return rng.choice(("", " ", "\n", "  ")) + text + rng.choice(("", " ", "\n", "\n\n"))


def _turn(rng: random.Random, messages: list[dict[str, Any]], tools: bool, calls: int) -> list[dict[str, Any]]:
    """One step of a session: the assistant answers (perhaps calling a tool, whose result follows), a user asks."""
    out = list(messages)
    if out and out[-1]["role"] == "user":
        if tools and rng.random() < 0.4:
            call_id = f"call{calls:05d}x"[:9]
            out.append({"role": "assistant", "content": None if rng.random() < 0.5 else _text(rng), "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps({"city": _text(rng)})}}]})
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(rng)})
        out.append({"role": "assistant", "content": _text(rng)})
    out.append({"role": "user", "content": _text(rng) if rng.random() < 0.8 else
                [{"type": "text", "text": _text(rng)}, {"type": "input_text", "text": _text(rng)}]})
    if rng.random() < 0.12 and len(out) > 2:  # an edit: an earlier message changes
        i = rng.randrange(len(out) - 1)
        if isinstance(out[i].get("content"), str):
            out[i] = {**out[i], "content": out[i]["content"] + _text(rng)}
    if rng.random() < 0.05 and len(out) > 4:  # the client drops the tail and asks again
        out = [*out[:len(out) // 2 * 2 - 1]] if out[len(out) // 2 * 2 - 2]["role"] == "user" else out
    return out


def _whole(tok: PromptTokenizer, messages: list[dict[str, Any]], options: dict[str, Any]) -> list[int] | str:
    try:
        return tok.encode_exact(tok.render_chat(messages, options))
    except TokenizerError as exc:
        return f"refused: {exc}"


def _cached(conv: ConversationTokens, messages: list[dict[str, Any]], options: dict[str, Any]) -> list[int] | str:
    try:
        return conv.encode(messages, options)
    except TokenizerError as exc:
        return f"refused: {exc}"


@pytest.mark.parametrize("name", [*_fixture_names(), "tiny-model"])
def test_ids_through_the_cache_equal_the_whole_rendering(name: str, tmp_path: Path) -> None:
    tok = PromptTokenizer(str(_folder(name, tmp_path)))
    conv = ConversationTokens(tok, max_bytes=1 << 20)
    assert conv.enabled, f"{name}: the load-time probe failed"
    rng = random.Random(name)
    compared = 0
    for session in range(6):
        tools = session % 2 == 1
        options: dict[str, Any] = {"tools": TOOLS} if tools else {}
        if session == 4:
            options["add_generation_prompt"] = False
        messages: list[dict[str, Any]] = [{"role": "system", "content": _text(rng)}] if session % 3 else []
        for _ in range(10):
            messages = _turn(rng, messages, tools, compared)
            whole = _whole(tok, messages, options)
            got = _cached(conv, messages, options)
            if isinstance(whole, str):
                assert isinstance(got, str), f"{name}: the whole rendering refused, the cache did not"
                continue
            assert got == whole, f"{name} session {session}: {len(got)} vs {len(whole)} ids"
            compared += 1
    assert compared >= 20, f"{name}: only {compared} renderable turns"
    assert conv.enabled and conv.cache.disabled == 0
    if name in ("tiny-model", "qwen2.5", "llama-3.1", "gemma-3", "mistral-nemo"):
        assert conv.cache.hits > 0, f"{name}: no hits"


def _tiny() -> tuple[PromptTokenizer, ConversationTokens]:
    tok = PromptTokenizer(str(TINY))
    return tok, ConversationTokens(tok)


def _session(turns: int, chars: int, seed: int = 0) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    words = ("alpha", "beta", "gamma", "naïve", "42", "done.", "\n")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    out = []
    for t in range(turns):
        if t:
            messages = [*messages, {"role": "assistant", "content": " ".join(rng.choice(words) for _ in range(9))}]
        text = " ".join(rng.choice(words) for _ in range(chars // 6))
        messages = [*messages, {"role": "user", "content": text}]
        out.append(messages)
    return out


def test_tokenization_reuses_the_earlier_turns() -> None:
    tok, conv = _tiny()
    seen = []
    for messages in _session(8, 3000):
        assert conv.encode(messages) == tok.encode_exact(tok.render_chat(messages))
        seen.append(conv.cache.tokens_reused)
    assert conv.cache.hits == 7 and conv.cache.misses == 1
    assert all(b > a for a, b in itertools.pairwise(seen[1:]))
    assert len(conv.cache) == 8 and conv.cache.counts()["entries"] == 8


def test_keys_change_with_the_messages_and_the_rendering_options() -> None:
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    d = digests(chat, None)
    assert digests(chat[:1], None) == d[:1] and len(set(d)) == 2
    assert digests([{"role": "user", "content": "a"}], None) == d[:1]  # equal values, other objects
    assert digests([{"content": "a", "role": "user"}], None) != d[:1]  # not canonical: a reordered message misses
    assert digests(chat, {"tools": TOOLS})[0] != d[0]
    assert digests(chat, {"add_generation_prompt": False}) == d  # the end of the rendering only
    assert digests(chat, {"chat_template_kwargs": {"x": 1}})[0] != d[0]
    assert digests(chat, {"merge_inline_system": True})[0] != d[0]


def test_colliding_keys_cost_only_a_miss(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chat's messages given the same keys: the entries' texts still decide, so the ids stay exact."""
    monkeypatch.setattr(conv_module, "digests", lambda messages, options: [7] * len(messages))
    tok, conv = _tiny()
    for seed in range(3):
        for messages in _session(5, 800, seed):
            assert conv.encode(messages) == tok.encode_exact(tok.render_chat(messages))
    assert conv.cache.hits > 0


def test_a_cut_only_before_an_added_token_that_nothing_straddles() -> None:
    rule = BoundaryRule(PromptTokenizer(str(TINY)).backend)
    text = "hello<|im_end|>\n<|im_start|>user\nhi"
    assert rule.safe(text, text.index("<|im_start|>")) and rule.safe(text, len(text))
    assert not rule.safe(text, text.index("user")) and not rule.safe(text, text.index("\n<|im_start|>"))
    assert not rule.safe("a<|im_end|>", 3)  # inside an added token


def test_bounds_are_never_exceeded() -> None:
    tok = PromptTokenizer(str(TINY))
    conv = ConversationTokens(tok, max_bytes=40_000, max_entries=12)
    cache = conv.cache
    for seed in range(12):
        for messages in _session(6, 900 + 300 * (seed % 4), seed):
            assert conv.encode(messages) == tok.encode_exact(tok.render_chat(messages))
            assert cache.bytes <= cache.max_bytes and len(cache) <= cache.max_entries
            live = {id(e.run): e.run for e in cache._entries.values()}
            assert cache.bytes == sum(len(r.ids) * 4 for r in live.values()) + conv_module.ENTRY_BYTES * len(cache)
    assert cache.hits > 0 and len(cache) > 0


def test_a_conversations_turns_share_one_array() -> None:
    tok, conv = _tiny()
    for messages in _session(6, 2000):
        conv.encode(messages)
    runs = {id(e.run) for e in conv.cache._entries.values()}
    assert len(conv.cache) == 6 and len(runs) == 1
    branch = [*_session(3, 2000)[-1], {"role": "assistant", "content": "another answer"},
              {"role": "user", "content": "a different question"}]
    assert conv.encode(branch) == tok.encode_exact(tok.render_chat(branch))  # a branch copies: still exact
    assert len({id(e.run) for e in conv.cache._entries.values()}) == 2


def test_preview_does_not_change_the_cache() -> None:
    tok, conv = _tiny()
    turns = _session(4, 2000)
    for messages in turns[:3]:
        conv.encode(messages)
    before = (list(conv.cache._entries), conv.cache.counts())
    with preview():
        assert conv.encode(turns[3]) == tok.encode_exact(tok.render_chat(turns[3]))
        assert conv.encode(turns[1]) == tok.encode_exact(tok.render_chat(turns[1]))
    assert (list(conv.cache._entries), conv.cache.counts()) == before


async def test_past_max_chars_the_cached_turns_count_in_full() -> None:
    tok, conv = _tiny()
    a = AsyncTokenizer(tok, timeout_s=5.0, max_chars=4000, conversations=conv)
    turns = _session(10, 2500)
    for messages in turns:
        whole = tok.encode_exact(tok.render_chat(messages))
        ids = await a.encode_chat(messages)
        assert not isinstance(ids, TokenHead) and ids == whole  # each turn's new text is within the budget
    assert len(tok.render_chat(turns[-1])) > 5 * 4000  # five times the budget, every id counted
    longer = [*turns[-1], {"role": "assistant", "content": "ok"}, {"role": "user", "content": "word " * 3000}]
    whole = tok.encode_exact(tok.render_chat(longer))
    head = await a.encode_chat(longer)
    assert isinstance(head, TokenHead) and head == whole[:len(head)]
    earlier = tok.encode_exact(tok.render_chat(turns[-1]))
    assert len(head) > len(earlier)  # every earlier turn, and the head of the new text
    assert abs(head.total - len(whole)) < 0.1 * len(whole)
    plain = AsyncTokenizer(tok, timeout_s=5.0, max_chars=4000)  # without the cache: the head of the whole chat
    assert len(await plain.encode_chat(longer)) < len(earlier) / 3
    a.close()
    plain.close()


async def test_inline_for_small_new_text_and_a_thread_for_large() -> None:
    tok, conv = _tiny()
    a = AsyncTokenizer(tok, timeout_s=5.0, inline_chars=2048, conversations=conv)
    turns = _session(5, 1500)
    await a.encode_chat(turns[0])
    inline = a.inline
    for messages in turns[1:]:
        assert await a.encode_chat(messages) == tok.encode_exact(tok.render_chat(messages))
    assert a.inline >= inline + 3  # the earlier turns cached: 1.5k characters of new text each
    a.close()


def test_a_failed_self_check_turns_the_cache_off(monkeypatch: pytest.MonkeyPatch) -> None:
    tok, conv = _tiny()
    turns = _session(4, 2000)
    conv.encode(turns[0])
    entry = next(iter(conv.cache._entries.values()))
    entry.run.ids[3] = (entry.run.ids[3] + 1) % 100  # a wrong id in the cache
    monkeypatch.setattr(conv_module, "SELF_CHECK_EVERY", 1)
    assert conv.encode(turns[1]) == tok.encode_exact(tok.render_chat(turns[1]))  # the whole text's ids
    assert not conv.enabled and conv.cache.counts()["disabled"] == 1 and len(conv.cache) == 0
    assert conv.encode(turns[2]) == tok.encode_exact(tok.render_chat(turns[2]))


def test_the_load_time_probe_catches_an_unsafe_cut(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A template with no token between messages, with every cut taken as safe: the probe finds ids that differ."""
    (tmp_path / "tokenizer.json").write_text((TINY / "tokenizer.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}))
    tok = PromptTokenizer(str(tmp_path))
    assert not ConversationTokens(tok).rule.safe("ab", 1)
    monkeypatch.setattr(BoundaryRule, "safe", lambda self, text, at: True)
    monkeypatch.setattr(BoundaryRule, "last_cut", lambda self, text, after: len(text) if len(text) > after else None)
    assert not ConversationTokens(tok).enabled


def test_the_setting_default_and_the_memory_cost() -> None:
    assert Settings().conversation_cache_mb == DEFAULT_MB
    tok = PromptTokenizer(str(TINY))
    conv = ConversationTokens(tok, max_bytes=8 << 20)
    sessions = [_session(8, 3000, seed) for seed in range(20)]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    cache = ConversationCache(8 << 20)
    conv.cache = cache
    for turns in sessions:
        for messages in turns:
            conv.encode(messages)
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert cache.bytes > 1 << 20
    assert 0.5 * cache.bytes <= held <= 1.1 * cache.bytes, (held, cache.bytes)
