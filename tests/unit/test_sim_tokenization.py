"""Engine-side tokenization: ChatML rendering, special tokens, token-id prompts."""

from pathlib import Path

import pytest

from sim.tokenization import PromptError, SimTokenizer

ASSETS = Path(__file__).resolve().parents[2] / "sim" / "assets" / "tiny-model"


@pytest.fixture(scope="module")
def tok() -> SimTokenizer:
    return SimTokenizer(ASSETS)


def test_chat_template_renders_chatml(tok: SimTokenizer) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert tok.render_chat(messages) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_text_parts_are_joined(tok: SimTokenizer) -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert tok.render_chat([{"role": "user", "content": parts}]) == tok.render_chat(
        [{"role": "user", "content": "a\nb"}])


def test_chat_encoding_has_special_tokens_once(tok: SimTokenizer) -> None:
    ids = tok.encode_chat([{"role": "user", "content": "hello"}])
    im_start = tok.tokenizer.token_to_id("<|im_start|>")
    assert ids[0] == im_start and ids.count(im_start) == 2
    assert ids == tok.tokenizer.encode(tok.render_chat([{"role": "user", "content": "hello"}]),
                                       add_special_tokens=False).ids


def test_prompt_forms(tok: SimTokenizer) -> None:
    assert tok.encode_prompt("the cache") == tok.tokenizer.encode("the cache", add_special_tokens=True).ids
    assert tok.encode_prompt([5, 6, 7]) == [5, 6, 7]
    for bad in ([], ["x"], 3, None):
        with pytest.raises(PromptError):
            tok.encode_prompt(bad)
    with pytest.raises(PromptError):
        tok.encode_request({"prompt": "x"}, chat=True)
