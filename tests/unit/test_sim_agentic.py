"""The simulated engine's Responses API and Anthropic Messages API, as vLLM 0.32 serves them.

One engine runs in-process; its `EngineCore.generate` is wrapped to record the prompt token ids each request
reaches the engine with, so a test can tell that a Responses or Messages request and its chat equivalent
run the very same prompt through the same engine path. Expected conversions marked "vLLM's output" were
produced by running vLLM 0.32's own conversion functions on the same inputs.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from sim.engine import Engine, EngineConfig
from sim.fleet import DEFAULT_TOKENIZER
from sim.messages_format import detect_merge_inline_system, to_chat_messages
from sim.response_store import ResponseStore, store_enabled
from sim.responses_format import construct_input_messages, continues_final_message
from sim.service_model import ServiceModel
from sim.tokenization import SimTokenizer

FAST = ServiceModel(prefill_tokens_per_s=1e9, prefill_overhead_ms=0, decode_base_ms=0, decode_per_seq_ms=0)
BLOCK = FAST.block_size
SYSTEM = "You are a careful assistant. " * 8  # long enough for several full KV blocks


@pytest.fixture(autouse=True)
def no_handler_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    yield
    errors = [r for r in caplog.records if r.levelno >= 40 and r.name.startswith(("aiohttp", "sim"))]
    assert not errors, [r.getMessage() for r in errors]


@pytest.fixture(scope="module")
def tok() -> SimTokenizer:
    return SimTokenizer(DEFAULT_TOKENIZER)


class Running:
    def __init__(self, engine: Engine, prompts: list[list[int]]) -> None:
        self.engine, self.prompts, self.url = engine, prompts, engine.url


async def _start(tok: SimTokenizer, store: bool | None) -> tuple[Engine, list[list[int]]]:
    engine = Engine(EngineConfig(name="agentic-0", ip="127.0.0.1", port=0, service=FAST, responses_store=store), tok)
    prompts: list[list[int]] = []
    generate = engine.core.generate

    def recording(prompt: Any, max_tokens: int, on_admit: Any = None) -> Any:
        prompts.append(list(prompt))
        return generate(prompt, max_tokens, on_admit)

    engine.core.generate = recording  # type: ignore[method-assign]
    await engine.start()
    return engine, prompts


@pytest.fixture
async def sim(tok: SimTokenizer) -> AsyncIterator[Running]:
    engine, prompts = await _start(tok, True)
    yield Running(engine, prompts)
    await engine.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, data=body if isinstance(body, (str, bytes)) else json.dumps(body)) as r:
        return r.status, await r.json()


async def post_sse(http: aiohttp.ClientSession, url: str, body: Any) -> list[tuple[str, dict[str, Any]]]:
    async with http.post(url, json=body) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        text = await r.text()
    events = []
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        events.append((lines[0][len("event: "):], json.loads(lines[1][len("data: "):])))
    return events


async def state(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/sim/state") as r:
        return await r.json()


def expected_hit(prompt_tokens: int, cached_prefix: int) -> int:
    """The sim's (and vLLM's) cache hit: whole blocks of the cached prefix, never the prompt's last token."""
    return min(cached_prefix // BLOCK * BLOCK, prompt_tokens - 1)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# ---- Responses API ---------------------------------------------------------------------------------------
async def test_responses_non_stream_runs_the_chat_rendering_of_instructions_and_input(
        sim: Running, http: aiohttp.ClientSession, tok: SimTokenizer) -> None:
    status, body = await post(http, sim.url + "/v1/responses", {
        "model": "tiny-model", "instructions": "be brief", "input": "hello there", "max_output_tokens": 4})
    assert status == 200, body
    expected = tok.encode_chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}])
    assert sim.prompts == [expected]
    assert body["id"].startswith("resp_") and body["object"] == "response" and body["model"] == "tiny-model"
    # The sim's filler never emits EOS: every answer stops at its limit, which vLLM reports as incomplete.
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    [item] = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["id"].startswith("msg_")
    [part] = item["content"]
    assert part["type"] == "output_text" and len(tok.tokenizer.encode(part["text"], add_special_tokens=False).ids) == 4
    assert body["usage"]["input_tokens"] == len(expected) and body["usage"]["output_tokens"] == 4
    assert body["usage"]["total_tokens"] == len(expected) + 4
    assert body["previous_response_id"] is None and body["max_output_tokens"] == 4 and body["tool_choice"] == "none"
    assert "store" not in body  # vLLM's ResponsesResponse has no such field


async def test_responses_stream_events_in_vllms_order(sim: Running, http: aiohttp.ClientSession) -> None:
    events = await post_sse(http, sim.url + "/v1/responses", {"input": "stream please", "stream": True,
                                                               "max_output_tokens": 3})
    names = [name for name, _ in events]
    assert names == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * 3, "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [data["type"] for _, data in events] == names
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    created = events[0][1]["response"]
    assert created["id"].startswith("resp_") and created["status"] == "in_progress" and created["output"] == []
    final = events[-1][1]["response"]
    assert final["id"] == created["id"] and final["usage"]["output_tokens"] == 3
    text = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
    item_id = events[2][1]["item"]["id"]
    assert final["output"] == [{"id": item_id, "content": [{"annotations": [], "text": text, "type": "output_text",
                                                            "logprobs": None}],
                                "role": "assistant", "status": "completed", "type": "message", "phase": None}]
    async with http.get(f"{sim.url}/v1/responses/{created['id']}") as r:
        assert r.status == 200 and await r.json() == final  # stored at completion


async def test_previous_response_id_brings_the_earlier_turn_and_hits_its_cache(
        sim: Running, http: aiohttp.ClientSession, tok: SimTokenizer) -> None:
    url = sim.url + "/v1/responses"
    _, first = await post(http, url, {"instructions": SYSTEM, "input": "turn one", "max_output_tokens": 5})
    follow_up = {"instructions": SYSTEM, "input": "turn two", "previous_response_id": first["id"],
                 "max_output_tokens": 5}
    before = await state(http, sim.url)
    status, second = await post(http, url, follow_up)
    assert status == 200, second
    assert second["previous_response_id"] == first["id"]
    answer = first["output"][0]["content"][0]["text"]
    expected = tok.encode_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "turn one"},
                                {"role": "assistant", "content": answer}, {"role": "user", "content": "turn two"}])
    assert sim.prompts[1] == expected
    assert second["usage"]["input_tokens"] == len(expected) > first["usage"]["input_tokens"] + 5
    hit = expected_hit(len(expected), common_prefix(sim.prompts[0], expected))
    assert hit >= BLOCK * 4 and second["usage"]["input_tokens_details"]["cached_tokens"] == hit
    after = await state(http, sim.url)
    assert after["prefix_cache_hits_total"] - before["prefix_cache_hits_total"] == hit
    # The same follow-up again: its whole prompt is cached now.
    _, repeat = await post(http, url, follow_up)
    assert sim.prompts[2] == expected
    assert repeat["usage"]["input_tokens_details"]["cached_tokens"] == expected_hit(len(expected), len(expected))
    final = await state(http, sim.url)
    assert final["prefix_cache_hits_total"] - after["prefix_cache_hits_total"] == expected_hit(len(expected),
                                                                                               len(expected))


async def test_instructions_do_not_carry_over_but_history_chains(sim: Running, http: aiohttp.ClientSession,
                                                                 tok: SimTokenizer) -> None:
    url = sim.url + "/v1/responses"
    _, r1 = await post(http, url, {"instructions": "first rules", "input": "a", "max_output_tokens": 2})
    _, r2 = await post(http, url, {"input": "b", "previous_response_id": r1["id"], "max_output_tokens": 2})
    _, r3 = await post(http, url, {"instructions": "new rules", "input": "c", "previous_response_id": r2["id"],
                                   "max_output_tokens": 2})
    assert r3["instructions"] == "new rules"
    text = [r["output"][0]["content"][0]["text"] for r in (r1, r2)]
    assert sim.prompts[2] == tok.encode_chat([
        {"role": "system", "content": "new rules"}, {"role": "user", "content": "a"},
        {"role": "assistant", "content": text[0]}, {"role": "user", "content": "b"},
        {"role": "assistant", "content": text[1]}, {"role": "user", "content": "c"}])


async def test_unknown_response_id_is_vllms_404(sim: Running, http: aiohttp.ClientSession) -> None:
    not_found = {"error": {"message": "Response with id 'resp_nope' not found.", "type": "invalid_request_error",
                           "param": "response_id", "code": 404}}
    status, body = await post(http, sim.url + "/v1/responses", {"input": "x", "previous_response_id": "resp_nope"})
    assert (status, body) == (404, not_found)
    assert sim.prompts == []  # refused before reaching the engine
    async with http.get(sim.url + "/v1/responses/resp_nope") as r:
        assert (r.status, await r.json()) == (404, not_found)
    status, body = await post(http, sim.url + "/v1/responses/resp_nope/cancel", {})
    assert (status, body) == (404, not_found)


async def test_get_and_cancel_a_stored_response(sim: Running, http: aiohttp.ClientSession) -> None:
    _, created = await post(http, sim.url + "/v1/responses", {"input": "keep me", "max_output_tokens": 2})
    async with http.get(f"{sim.url}/v1/responses/{created['id']}") as r:
        assert r.status == 200 and await r.json() == created
    # vLLM cancels only queued or running background responses; a finished synchronous one is a 400.
    status, body = await post(http, f"{sim.url}/v1/responses/{created['id']}/cancel", {})
    assert (status, body) == (400, {"error": {"message": "Cannot cancel a synchronous response.",
                                              "type": "invalid_request_error", "param": "response_id", "code": 400}})
    _, unstored = await post(http, sim.url + "/v1/responses", {"input": "forget me", "store": False,
                                                                "max_output_tokens": 2})
    async with http.get(f"{sim.url}/v1/responses/{unstored['id']}") as r:
        assert r.status == 404


async def test_store_disabled_makes_follow_ups_404(tok: SimTokenizer, http: aiohttp.ClientSession) -> None:
    engine, _ = await _start(tok, False)
    try:
        status, first = await post(http, engine.url + "/v1/responses", {"input": "hi", "max_output_tokens": 2})
        assert status == 200  # `store` (default true) is silently ignored, as in vLLM
        status, body = await post(http, engine.url + "/v1/responses",
                                  {"input": "again", "previous_response_id": first["id"]})
        assert status == 404 and body["error"]["message"] == f"Response with id '{first['id']}' not found."
        async with http.get(f"{engine.url}/v1/responses/{first['id']}") as r:
            assert r.status == 404
    finally:
        await engine.stop()


def test_store_option_env_var_and_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_ENABLE_RESPONSES_API_STORE", raising=False)
    assert store_enabled(None) is True  # the sim's default, so demos can chain
    monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", "0")
    assert store_enabled(None) is False and store_enabled(True) is True
    monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", "1")
    assert store_enabled(None) is True and store_enabled(False) is False
    store = ResponseStore(True, max_entries=3)
    for i in range(5):
        store.put_messages(f"r{i}", [{"role": "user", "content": str(i)}])
        store.put_response(f"r{i}", {"id": f"r{i}"})
    assert len(store) == 3 and store.response("r1") is None and store.response("r4") == {"id": "r4"}
    by_size = ResponseStore(True, max_chars=100)
    by_size.put_messages("big", [{"role": "user", "content": "x" * 80}])
    by_size.put_messages("next", [{"role": "user", "content": "y" * 80}])
    assert by_size.messages("big") is None and by_size.messages("next") is not None


def test_responses_items_convert_as_vllm_does() -> None:
    items: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "input_text", "text": "what is the weather"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me check"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": "noon"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "developer", "content": "be terse"},
        {"type": "message", "role": "user", "content": "thanks"},
    ]
    vllm_output = [  # vLLM's output for the same items
        {"role": "system", "content": "sys"},
        {"content": [{"text": "what is the weather", "type": "input_text"}], "role": "user"},
        {"role": "assistant", "reasoning": "think", "content": "let me check", "tool_calls": [
            {"id": "call_1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}, "type": "function"},
            {"id": "call_2", "function": {"name": "get_time", "arguments": "{}"}, "type": "function"}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        {"role": "tool", "content": "noon", "tool_call_id": "call_2"},
        {"role": "assistant", "content": "It is sunny."},
        {"content": "be terse", "role": "developer"},
        {"content": "thanks", "role": "user", "type": "message"},
    ]
    assert construct_input_messages("sys", items) == vllm_output
    assert not continues_final_message(items)
    assert continues_final_message([{"role": "user", "content": "hi"}, {
        "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "partial"}],
        "status": "in_progress"}])


async def test_a_responses_request_and_its_chat_equivalent_run_the_same_prompt(
        sim: Running, http: aiohttp.ClientSession) -> None:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather in Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21C"},
        {"role": "user", "content": "and tomorrow?"},
    ]
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    status, resp = await post(http, sim.url + "/v1/responses", {"instructions": SYSTEM, "input": items,
                                                                 "tools": tools, "max_output_tokens": 2})
    assert status == 200, resp
    assert resp["tools"][0]["name"] == "get_weather" and resp["tool_choice"] == "auto"
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
            {"role": "user", "content": "and tomorrow?"}]
    before = await state(http, sim.url)
    status, _ = await post(http, sim.url + "/v1/chat/completions", {"messages": chat, "max_tokens": 2})
    assert status == 200
    assert sim.prompts[0] == sim.prompts[1]
    after = await state(http, sim.url)
    n = len(sim.prompts[0])
    assert after["prefix_cache_hits_total"] - before["prefix_cache_hits_total"] == expected_hit(n, n)


async def test_responses_bad_bodies_are_400s(sim: Running, http: aiohttp.ClientSession) -> None:
    url = sim.url + "/v1/responses"
    cases: list[tuple[Any, int, str]] = [
        ("not json", 400, "Bad Request"), ({"model": "tiny-model"}, 400, "Bad Request"),
        ({"input": 5}, 400, "Bad Request"), ({"input": "x", "max_output_tokens": "many"}, 400, "Bad Request"),
        ({"input": [{"type": "nope"}]}, 400, "BadRequestError"),
        ({"input": [{"role": "robot", "content": "x"}]}, 400, "Bad Request"),
        ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "zz"}]}, 400, "BadRequestError"),
        ({"input": "x", "tool_choice": "required"}, 400, "BadRequestError"),
        ({"input": "x", "max_output_tokens": 0}, 400, "BadRequestError"),
        ({"input": "x", "background": True}, 400, "BadRequestError"),
        ({"input": "x", "model": "other"}, 404, "NotFoundError"),
    ]
    for body, code, kind in cases:
        status, answer = await post(http, url, body)
        assert (status, answer["error"]["type"], answer["error"]["code"]) == (code, kind, code), (body, answer)
    _, answer = await post(http, url, {"input": [{"type": "nope"}]})
    assert answer["error"]["message"] == "Unsupported input item type: nope"
    assert sim.prompts == []


# ---- Messages API ----------------------------------------------------------------------------------------
async def test_messages_non_stream(sim: Running, http: aiohttp.ClientSession, tok: SimTokenizer) -> None:
    status, body = await post(http, sim.url + "/v1/messages", {
        "model": "tiny-model", "max_tokens": 3, "system": "be kind",
        "messages": [{"role": "user", "content": "hello"}]})
    assert status == 200, body
    expected = tok.encode_chat([{"role": "system", "content": "be kind"}, {"role": "user", "content": "hello"}])
    assert sim.prompts == [expected]
    assert body["id"].startswith("chatcmpl-")  # vLLM answers with the chat completion's id
    assert (body["type"], body["role"], body["model"], body["stop_reason"]) == ("message", "assistant", "tiny-model",
                                                                                "max_tokens")
    assert [block["type"] for block in body["content"]] == ["text"] and body["content"][0]["text"]
    assert body["usage"] == {"input_tokens": len(expected), "output_tokens": 3}
    assert "stop_sequence" not in body  # serialized with exclude_none


async def test_messages_stream(sim: Running, http: aiohttp.ClientSession) -> None:
    events = await post_sse(http, sim.url + "/v1/messages", {
        "model": "tiny-model", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    names = [name for name, _ in events]
    assert names == ["message_start", "content_block_start", *["content_block_delta"] * 3, "content_block_stop",
                     "message_delta", "message_stop"]
    assert [data["type"] for _, data in events] == names
    n = len(sim.prompts[0])
    start = events[0][1]["message"]
    assert start["id"].startswith("chatcmpl-") and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"] == {"input_tokens": n, "output_tokens": 0}
    assert events[1][1] == {"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0}
    assert all(data["delta"]["type"] == "text_delta" and data["index"] == 0 for _, data in events[2:5])
    assert events[6][1] == {"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                            "usage": {"input_tokens": n, "output_tokens": 3}}
    assert events[7][1] == {"type": "message_stop"}


async def test_messages_system_blocks_drop_the_billing_header(sim: Running, http: aiohttp.ClientSession,
                                                              tok: SimTokenizer) -> None:
    status, _ = await post(http, sim.url + "/v1/messages", {
        "model": "tiny-model", "max_tokens": 1,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc"},
                   {"type": "text", "text": "You are"}, {"type": "text", "text": " helpful"}],
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "system", "content": [{"type": "text", "text": "x-anthropic-billing-header: z"},
                                                    {"type": "text", "text": "reminder"}]},
                     {"role": "user", "content": "go"}]})
    assert status == 200
    # The sim's template renders a non-leading system message, so inline ones stay where they are.
    assert sim.engine.messages.merge_inline_system is False
    assert sim.prompts == [tok.encode_chat([{"role": "system", "content": "You are helpful"},
                                            {"role": "user", "content": "hi"},
                                            {"role": "system", "content": "reminder"},
                                            {"role": "user", "content": "go"}])]


def test_inline_system_merge_is_detected_as_vllm_does() -> None:
    first_only = ("{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
                  "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
                  "{{ m['content'] }}{% endfor %}")
    assert detect_merge_inline_system(first_only) is True  # raise_exception is undefined in a plain sandbox
    assert detect_merge_inline_system(None) is True
    assert detect_merge_inline_system(SimTokenizer(DEFAULT_TOKENIZER).chat_template) is False
    body = {"system": "top", "messages": [{"role": "user", "content": "a"},
                                          {"role": "system", "content": "inline"}, {"role": "user", "content": "b"}]}
    assert to_chat_messages(body, merge_inline_system=True) == [
        {"role": "system", "content": "topinline"}, {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]


def test_messages_blocks_convert_as_vllm_does() -> None:
    body = {"system": [{"type": "text", "text": "x-anthropic-billing-header: abc"}, {"type": "text", "text": "You are"},
                       {"type": "text", "text": " helpful"}],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                                  {"type": "text", "text": "calling"},
                                                  {"type": "tool_use", "id": "tu1", "name": "get", "input": {"a": 1}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "tu1",
                     "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]},
                    {"type": "text", "text": "next"}]},
                {"role": "system", "content": "inline sys"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "zz"}]}]}
    vllm_output = [  # vLLM's output for the same request (merge_inline_system=False)
        {"content": "You are helpful", "role": "system"}, {"content": "hi", "role": "user"},
        {"role": "assistant", "content": "calling", "tool_calls": [
            {"id": "tu1", "function": {"arguments": '{"a": 1}', "name": "get"}, "type": "function"}],
         "reasoning": "hmm"},
        {"content": "r1\nr2", "role": "tool", "tool_call_id": "tu1"}, {"content": "next", "role": "user"},
        {"content": "inline sys", "role": "system"},
        {"role": "user", "content": [{"text": "a", "type": "text"}, {"text": "b", "type": "text"}]},
        {"role": "assistant", "content": "Tool result: zz"}]
    assert to_chat_messages(body, merge_inline_system=False) == vllm_output


async def test_messages_tool_use_and_result_run_the_chat_equivalent(sim: Running, http: aiohttp.ClientSession,
                                                                     tok: SimTokenizer) -> None:
    status, _ = await post(http, sim.url + "/v1/messages", {
        "model": "tiny-model", "max_tokens": 1,
        "tools": [{"name": "get", "description": "d", "input_schema": {"properties": {}}}],
        "messages": [{"role": "user", "content": "look it up"},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "tu1", "name": "get", "input": {}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "found"}]}]})
    assert status == 200
    assert sim.prompts == [tok.encode_chat([
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "tool_calls": [{"id": "tu1", "type": "function",
                                              "function": {"name": "get", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "tu1", "content": "found"}])]


async def test_messages_errors(sim: Running, http: aiohttp.ClientSession) -> None:
    url = sim.url + "/v1/messages"
    status, body = await post(http, url, {"model": "other", "max_tokens": 1, "messages": [{"role": "user",
                                                                                           "content": "x"}]})
    assert (status, body) == (404, {"type": "error", "error": {"type": "NotFoundError",
                                                               "message": "The model `other` does not exist."}})
    for bad in ({"model": "tiny-model", "messages": []}, {"model": "tiny-model", "max_tokens": 0, "messages": []},
                {"model": "tiny-model", "max_tokens": 1, "messages": [{"role": "tool", "content": "x"}]},
                {"model": "tiny-model", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "?"}]}]},
                "[1, 2]"):
        status, body = await post(http, url, bad)
        # Request validation answers before the Messages router: vLLM's OpenAI-shaped validation error.
        assert status == 400 and body["error"]["type"] == "Bad Request", (bad, body)
    assert sim.prompts == []
