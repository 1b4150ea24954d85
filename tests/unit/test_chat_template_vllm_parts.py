"""vLLM 0.32's text part types (renderers/chat_utils.py MM_PARSER_MAP, TEXT_PART_TYPES) and its Anthropic Messages
endpoint's merge of inline system messages for templates that require system-first ordering
(entrypoints/anthropic/serving.py `_detect_merge_inline_system`, `_convert_system_message`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from loadaware.tokenize.chat_template import ChatTemplate, ChatTemplateError, requires_system_first
from loadaware.tokenize.tokenizer import MERGE_INLINE_SYSTEM, PromptTokenizer

TINY = Path(__file__).resolve().parents[2] / "sim" / "assets" / "tiny-model"
SEE = "{% for m in messages %}{{ m | tojson }}\n{% endfor %}"
SEE_PARTS = "{% for m in messages %}{% for p in m.content %}{{ p | tojson }}\n{% endfor %}{% endfor %}"

PARTS: list[Any] = [
    {"type": "text", "text": "a"},
    {"type": "input_text", "text": "b"},
    {"type": "output_text", "text": "c"},
    {"type": "refusal", "refusal": "d"},
    {"type": "thinking", "thinking": "e"},
    {"type": "text", "text": None},  # skipped (vLLM's PART_TYPES_TO_SKIP_NONE_CONTENT)
    {"type": "refusal"},  # skipped
    {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
    "f",  # a plain string part
]


def test_text_part_types_joined_for_a_string_template() -> None:
    out = ChatTemplate(SEE).render([{"role": "user", "content": PARTS}], add_generation_prompt=False)
    assert json.loads(out) == {"role": "user", "content": "a\nb\nc\nd\ne\nf"}


def test_text_part_types_as_text_parts_for_an_openai_template() -> None:
    template = ChatTemplate(SEE_PARTS)
    assert template.content_format == "openai"
    out = [json.loads(line) for line in template.render([{"role": "user", "content": PARTS}]).splitlines()]
    assert out == [{"type": "text", "text": t} for t in "abcde"] + [{"type": "image"}, {"type": "text", "text": "f"}]


def test_a_text_part_without_a_string_is_refused_for_a_string_template() -> None:
    with pytest.raises(ChatTemplateError):  # vLLM's "\n".join fails on it: the request never renders
        ChatTemplate(SEE).render([{"role": "user", "content": [{"type": "thinking"}]}])


def test_requires_system_first_is_vllms_probe() -> None:
    assert requires_system_first(None) and requires_system_first("")
    assert not requires_system_first("{% for m in messages %}{{ m.content }}{% endfor %}")
    guard = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
             "{{ raise_exception('System message must be first') }}{% endif %}{{ m.content }}{% endfor %}")
    assert requires_system_first(guard)  # raise_exception is undefined in the plain environment: still an error
    assert ChatTemplate(guard).requires_system_first
    assert requires_system_first("{% generation %}x{% endgeneration %}")  # unknown tag in the plain environment
    assert not requires_system_first("{{ messages[0].content.upper() }}")
    assert requires_system_first("{{ messages[7].content.x }}")  # an attribute of an undefined: an error


def _model_with(tmp_path: Path, template: str) -> PromptTokenizer:
    shutil.copy(TINY / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return PromptTokenizer(str(tmp_path))


GUARD = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
         "{{ raise_exception('System message must be first') }}{% endif %}[{{ m.role }}:{{ m.content }}]{% endfor %}")
CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "top."},
    {"role": "user", "content": "u1"},
    {"role": "system", "content": " reminder one."},
    {"role": "assistant", "content": "a1"},
    {"role": "system", "content": [{"type": "text", "text": " two"}, {"type": "text", "text": "!"}]},
    {"role": "user", "content": "u2"},
]


def test_inline_system_messages_merged_for_a_system_first_template(tmp_path: Path) -> None:
    tok = _model_with(tmp_path, GUARD)
    assert tok.chat_template is not None and tok.chat_template.requires_system_first
    options = {MERGE_INLINE_SYSTEM: True, "add_generation_prompt": False}
    assert tok.render_chat(CHAT, options) == "[system:top. reminder one. two!][user:u1][assistant:a1][user:u2]"
    assert options[MERGE_INLINE_SYSTEM] is True  # the caller's options are not changed
    assert tok.render_chat([{"role": "user", "content": "u"}], {MERGE_INLINE_SYSTEM: True}) == "[user:u]"
    with pytest.raises(Exception, match="System message must be first"):  # no merge without the option
        tok.render_chat(CHAT, {"add_generation_prompt": False})


def test_messages_untouched_when_the_template_accepts_inline_system(tmp_path: Path) -> None:
    tok = _model_with(tmp_path, "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
                                "{{ merge_inline_system is defined }}")
    assert tok.chat_template is not None and not tok.chat_template.requires_system_first
    text = tok.render_chat(CHAT[:4], {MERGE_INLINE_SYSTEM: True})
    assert text == "[system:top.][user:u1][system: reminder one.][assistant:a1]False"  # the key never reaches it


def test_the_fixtures_that_require_system_first() -> None:
    """vLLM 0.32's own `_detect_merge_inline_system` over tests/fixtures/chat_templates answers the same (checked once
    with .vllm-venv): only Mistral NeMo's and SmolLM3's templates refuse an inline system message."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
    sources = {p.stem: json.loads(p.read_text())["chat_template"] for p in fixtures.glob("*.json")}
    found = {name for name, source in sources.items() if requires_system_first(source)}
    assert found == {"mistral-nemo", "smollm3"}
