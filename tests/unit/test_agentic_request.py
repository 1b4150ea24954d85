"""Parsing the Responses and Messages APIs and a stored response's own paths (routing/request.py, agentic.py).
That the conversions equal vLLM's own is tests/vllm/test_agentic_conversion.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loadaware.routing.request import (
    MAX_MESSAGES,
    STATE_KIND,
    BadRequest,
    inference_kind,
    parse_body,
    state_path_id,
    state_request,
)


def parse(kind: str, body: dict[str, Any]) -> Any:
    return parse_body(kind, json.dumps(body).encode())


@pytest.mark.parametrize(("method", "path", "kind"), [
    ("POST", "/v1/responses", "responses"), ("POST", "/v1/messages", "messages"),
    ("POST", "/v1/responses?x=1", "responses"), ("GET", "/v1/responses/resp_1", STATE_KIND),
    ("POST", "/v1/responses/resp_1/cancel", STATE_KIND), ("DELETE", "/v1/responses/resp_1", None),
    ("GET", "/v1/responses/resp_1/input_items", None), ("GET", "/v1/responses", None),
    ("POST", "/v1/responses/resp_1", None), ("GET", "/v1/responses/", None),
    ("POST", "/v1/messages/count_tokens", None),
])
def test_paths(method: str, path: str, kind: str | None) -> None:
    assert inference_kind(method, path) == kind


def test_a_state_path_names_its_id_unquoted_and_bounded() -> None:
    assert state_path_id("GET", "/v1/responses/resp%5Fa") == "resp_a"
    assert state_path_id("GET", "/v1/responses/" + "x" * 257) is None
    request = state_request("POST", "/v1/responses/resp_9/cancel")
    assert request is not None and request.state_id == "resp_9" and not request.has_prompt
    assert state_request("POST", "/v1/completions") is None


def test_a_responses_request_is_its_chat() -> None:
    r = parse("responses", {"model": "m", "instructions": "sys", "input": "hello",
                            "reasoning": {"effort": "low"}})
    assert r.messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
    assert r.chat_options == {"add_generation_prompt": True,
                              "chat_template_kwargs": {"reasoning_effort": "low", "enable_thinking": True}}
    assert r.stores and r.state_id is None and r.model == "m"


def test_a_follow_up_names_its_state_and_store_false_is_not_learned() -> None:
    r = parse("responses", {"input": "more", "previous_response_id": "resp_7", "store": False})
    assert r.state_id == "resp_7" and not r.stores


def test_a_partial_assistant_message_is_continued() -> None:
    r = parse("responses", {"input": [{"role": "user", "content": "q"},
                                      {"type": "message", "role": "assistant", "status": "incomplete",
                                       "content": [{"type": "output_text", "text": "The answer is"}]}]})
    assert r.chat_options["continue_final_message"] and not r.chat_options["add_generation_prompt"]


@pytest.mark.parametrize("body", [
    {"input": 5}, {"input": [7]}, {"input": [{"type": "mystery"}]}, {"input": "x", "previous_response_id": 3},
    {"input": [{"type": "reasoning", "encrypted_content": "zzz"}]}, {"input": "x", "tools": [{"type": "function"}]},
])
def test_bad_responses_bodies_are_400s(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        parse("responses", body)


@pytest.mark.parametrize("body", [
    {"messages": "hi"}, {"messages": [3]}, {"messages": [{"role": "user", "content": [5]}]},
    {"messages": [], "tools": {"name": "f"}}, {"messages": [], "tools": [{"description": "no name"}]},
])
def test_bad_messages_bodies_are_400s(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        parse("messages", body)


def test_a_messages_request_asks_for_the_system_first_merge() -> None:
    r = parse("messages", {"system": "s", "messages": [{"role": "user", "content": "hi"}],
                           "tools": [{"name": "f", "input_schema": {"type": "object"}}]})
    assert r.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    assert r.chat_options["merge_inline_system"] is True
    assert r.chat_options["tools"] == [{"type": "function", "function": {
        "name": "f", "description": None, "parameters": {"type": "object"}}}]


def test_too_many_items_route_on_load() -> None:
    items = [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)
    assert parse("responses", {"input": items}).unscored == "too_many_messages"
    assert parse("messages", {"messages": items}).unscored == "too_many_messages"


def test_an_empty_input_has_no_prompt() -> None:
    assert not parse("responses", {"input": []}).has_prompt
    assert not parse("messages", {"messages": []}).has_prompt
