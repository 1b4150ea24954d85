"""The chat template environment (transformers' apply_chat_template semantics, vLLM's message shaping), and a
template that cannot render: told once at start, chat then routes on load."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import RequestLifecycle
from loadaware.load.tracker import LoadTracker
from loadaware.policies import make_policy
from loadaware.routing.builder import build_decider
from loadaware.routing.request import InferenceRequest, parse_body
from loadaware.tokenize.chat_template import ChatTemplate, ChatTemplateError, read_tokenizer_config
from loadaware.tokenize.tokenizer import AsyncTokenizer, ChatTemplateUnavailable, PromptTokenizer, TokenizerError

TINY = Path(__file__).resolve().parents[2] / "sim" / "assets" / "tiny-model"
NOW = datetime(2024, 7, 26, 12, 0)


def render(source: str, messages: Sequence[Mapping[str, Any]] | None = None, **kw: Any) -> str:
    return ChatTemplate(source, {"bos_token": "<s>"}, clock=lambda: NOW).render(
        messages or [{"role": "user", "content": "hi"}], **kw)


def test_strftime_now_and_special_tokens() -> None:
    assert render('{{ bos_token }}{{ strftime_now("%d %b %Y") }}') == "<s>26 Jul 2024"


def test_tojson_takes_transformers_arguments() -> None:
    x: dict[str, Any] = {"extra": {"x": {"b": 1, "a": "é<"}}}
    assert render("{{ x | tojson }}", **x) == '{"b": 1, "a": "é<"}'  # no HTML escaping
    assert render("{{ x | tojson(indent=2) }}", **x) == '{\n  "b": 1,\n  "a": "é<"\n}'
    assert render("{{ x | tojson(separators=(',', ':'), sort_keys=true) }}", **x) == '{"a":"é<","b":1}'
    assert render("{{ x | tojson(ensure_ascii=true) }}", **x) == '{"b": 1, "a": "\\u00e9<"}'


def test_tools_as_vllm_dumps_them() -> None:
    tools = [{"function": {"parameters": {"type": "object"}, "name": "f", "strict": True}, "type": "function"}]
    assert render("{{ tools | tojson }}", tools=tools) == \
        '[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object"}, ' \
        '"strict": true}}]'
    with pytest.raises(ChatTemplateError):
        render("{{ tools }}", tools=[{"type": "function"}])


def test_loop_controls_namespace_dict_and_trimming() -> None:
    source = ("{% set ns = namespace(n=0) %}\n{% for m in messages %}\n  {% if loop.index > 1 %}{% break %}{% endif %}"
              "\n{% set ns.n = ns.n + 1 %}\n{{ m.role }}\n{% endfor %}{{ ns.n }}{{ dict(a=1)['a'] }}")
    assert render(source, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]) == "user\n11"
    with pytest.raises(ChatTemplateError):
        render("{% set ns = namespace() %}{% set ns._x = 1 %}")


def test_raise_exception_is_a_refusal() -> None:
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render("{{ raise_exception('roles must alternate') }}")


def test_generation_tag_renders_its_body() -> None:
    assert render("{% generation %}{{ messages[0].content }}{% endgeneration %}") == "hi"


def test_add_generation_prompt_documents_and_extra_kwargs() -> None:
    source = "{{ add_generation_prompt }}|{{ documents[0].title if documents else '-' }}|{{ enable_thinking }}"
    assert render(source, extra={"enable_thinking": False}) == "True|-|False"
    assert render(source, documents=[{"title": "T", "text": "x"}], add_generation_prompt=False,
                  extra={"enable_thinking": True}) == "False|T|True"


def test_continue_final_message_leaves_it_open() -> None:
    chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    msgs = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "One, two,"}]
    assert render(chatml, msgs, add_generation_prompt=False, continue_final_message=True) == \
        "<|im_start|>user\nCount<|im_end|>\n<|im_start|>assistant\nOne, two,"
    trims = "{% for m in messages %}[{{ m.content | trim }}]{% endfor %}"  # the space after the tag is trimmed
    assert render(trims, [{"role": "assistant", "content": "abc  "}], add_generation_prompt=False,
                  continue_final_message=True) == "[abc"
    with pytest.raises(ChatTemplateError):
        render(chatml, msgs, add_generation_prompt=True, continue_final_message=True)


def test_messages_as_vllm_hands_them_over() -> None:
    see = "{% for m in messages %}{{ m | tojson(sort_keys=true) }}\n{% endfor %}"
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}},
                                     {"type": "text", "text": "b"}], "extra": 1},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{\"k\": 1}"}}]},
        {"role": "assistant", "content": "ok", "tool_calls": [], "reasoning_content": "hmm"},
        {"role": "tool", "tool_call_id": "x", "content": "r", "name": "f"},
    ]
    lines = [json.loads(line) for line in render(see, msgs).splitlines()]
    assert lines[0] == {"role": "user", "content": "a\nb"}  # string format: text parts joined, extras dropped
    assert lines[1]["content"] == "" and lines[1]["tool_calls"][0]["function"]["arguments"] == {"k": 1}
    assert lines[2] == {"role": "assistant", "content": "ok", "reasoning": "hmm", "reasoning_content": "hmm",
                        "thinking": "hmm"}
    assert lines[3] == {"role": "tool", "content": "r", "tool_call_id": "x", "name": "f"}


def test_content_format_is_detected_as_vllm_does() -> None:
    assert ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}").content_format == "string"
    parts = "{% for m in messages[1:] %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}"
    assert ChatTemplate(parts).content_format == "openai"
    via = "{% set loop_messages = messages %}{% for m in loop_messages %}{% for p in m.content %}x{% endfor %}" \
          "{% endfor %}"
    assert ChatTemplate(via).content_format == "openai"
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert ChatTemplate(parts.replace("[1:]", "")).render(msgs) == "ab"


def test_tokenizer_config_special_tokens(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
        "bos_token": {"content": "<s>", "lstrip": False}, "eos_token": "</s>", "mask_token": "<m>"}))
    template, specials = read_tokenizer_config(str(tmp_path))
    assert template == "D" and specials["bos_token"] == "<s>" and specials["mask_token"] == "<m>"
    (tmp_path / "chat_template.jinja").write_text("J")
    assert read_tokenizer_config(str(tmp_path))[0] == "J"


def _model_with(tmp_path: Path, template: str) -> Path:
    shutil.copy(TINY / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template,
                                                                "eos_token": "<|im_end|>"}))
    return tmp_path


def test_llama_style_template_with_strftime_now_renders(tmp_path: Path) -> None:
    """The issue's case: a template calling strftime_now used to fail every chat request (tokenizer_error)."""
    source = ('{%- if strftime_now is defined %}{%- set date_string = strftime_now("%d %b %Y") %}{%- endif %}'
              '{{- "Today Date: " + date_string + "\\n\\n" }}{% for m in messages %}{{ m.content }}{% endfor %}')
    tok = PromptTokenizer(str(_model_with(tmp_path, source)), clock=lambda: NOW)
    assert tok.chat_unavailable is None
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == "Today Date: 26 Jul 2024\n\nhi"
    assert tok.encode_chat([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("template, reason", [
    ("{% for m in messages %}{{ m.content }", "does not compile"),
    ("{{ raise_exception('bad template') }}", "bad template"),
])
async def test_a_template_that_cannot_render_is_told_once(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                          template: str, reason: str) -> None:
    with caplog.at_level(logging.WARNING, logger="loadaware.tokenize.tokenizer"):
        tok = PromptTokenizer(str(_model_with(tmp_path, template)))
    assert tok.chat_template is None and tok.chat_unavailable and reason in tok.chat_unavailable
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and reason in caplog.text
    with pytest.raises(ChatTemplateUnavailable):
        tok.encode_chat([{"role": "user", "content": "hi"}])
    assert tok.encode_prompt("completions still tokenize")
    # Through the pipeline: chat routes on load with its own reason, and nothing more is logged per request.
    caplog.clear()
    decider = build_decider(make_policy("loadaware"), EndpointRegistry(("127.0.0.2:8000", "127.0.0.3:8000")),
                      LoadTracker(stale_s=5), RequestLifecycle(), AsyncTokenizer(tok, timeout_s=2.0))
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            decision = await decider.decide(InferenceRequest("chat", messages=[{"role": "user", "content": "x"}]),
                                            count=False)
            assert decision.reasons == ("no_chat_template",) and decision.endpoint is not None
    assert not [r for r in caplog.records if r.name.startswith("loadaware.routing")]


def test_bad_input_is_a_per_request_error_not_a_template_failure() -> None:
    tok = PromptTokenizer(str(TINY))
    assert tok.chat_template is not None
    with pytest.raises(TokenizerError):
        tok.encode_chat([{"role": "user", "content": "x"}], {"continue_final_message": True,
                                                            "add_generation_prompt": True})


def test_chat_request_carries_the_template_options() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}],
            "add_generation_prompt": False, "continue_final_message": True, "documents": None,
            "chat_template_kwargs": {"enable_thinking": False}, "temperature": 0.1}
    request = parse_body("chat", json.dumps(body).encode())
    assert request.chat_options == {"tools": [{"type": "function"}], "add_generation_prompt": False,
                                    "continue_final_message": True,
                                    "chat_template_kwargs": {"enable_thinking": False}}
    plain = parse_body("chat", json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode())
    assert plain.chat_options is None


async def test_the_request_options_reach_the_template(tmp_path: Path) -> None:
    """tools / add_generation_prompt from the request body change the tokens routed on, as they change the engine's."""
    source = ("{% if tools %}[{{ tools | length }} tools]{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}")
    tok = AsyncTokenizer(PromptTokenizer(str(_model_with(tmp_path, source))), timeout_s=2.0)
    decider = build_decider(make_policy("loadaware"), EndpointRegistry(("127.0.0.2:8000",)), LoadTracker(stale_s=5),
                      RequestLifecycle(), tok)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    plain = await decider.prompt_tokens(parse_body("chat", json.dumps(body).encode()))
    with_tools = await decider.prompt_tokens(parse_body("chat", json.dumps(
        {**body, "tools": [{"type": "function", "function": {"name": "f"}}], "add_generation_prompt": False}).encode()))
    assert plain == tok.tokenizer._plain("hi<|im_start|>assistant")
    assert with_tools == tok.tokenizer._plain("[1 tools]hi")
    tok.close()


def test_chat_template_kwargs_as_vllm_takes_them(tmp_path: Path) -> None:
    source = "{{ add_generation_prompt }}|{{ tools | length if tools else 0 }}|{{ flag }}"
    tok = PromptTokenizer(str(_model_with(tmp_path, source)))
    chat = [{"role": "user", "content": "x"}]
    assert tok.render_chat(chat, {"chat_template_kwargs": {"flag": 1}}) == "True|0|1"
    # the kwargs override the request's own fields, as apply_chat_template's keyword arguments do in vLLM
    assert tok.render_chat(chat, {"add_generation_prompt": True, "chat_template_kwargs": {
        "add_generation_prompt": False, "tools": [{"function": {"name": "f"}}], "flag": 2}}) == "False|1|2"
    with pytest.raises(TokenizerError):
        tok.render_chat(chat, {"chat_template_kwargs": {"tokenize": True}})
