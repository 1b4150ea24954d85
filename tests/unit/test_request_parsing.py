"""What a request body means for routing; bad input gets a clear outcome."""

from __future__ import annotations

import pytest

from loadaware.load.vllm_metrics import parse_vllm_gauges
from loadaware.routing.request import BadRequest, inference_kind, parse_body


def test_inference_kind() -> None:
    assert inference_kind("POST", "/v1/completions") == "completions"
    assert inference_kind("POST", "/v1/chat/completions?x=1") == "chat"
    assert inference_kind("GET", "/v1/completions") is None
    assert inference_kind("POST", "/v1/embeddings") is None


def test_completions_prompts() -> None:
    assert parse_body("completions", b'{"prompt": "hi", "model": "m"}').prompt == "hi"
    assert parse_body("completions", b'{"prompt": [1, 2, 3]}').prompt == [1, 2, 3]
    assert parse_body("completions", b'{"prompt": ["a", "b"]}').prompt == "a"
    assert parse_body("completions", b'{"prompt": [[4, 5], [6]]}').prompt == [4, 5]
    assert not parse_body("completions", b'{"model": "m"}').has_prompt


def test_chat_messages() -> None:
    r = parse_body("chat", b'{"messages": [{"role": "user", "content": "hi"}]}')
    assert r.messages == [{"role": "user", "content": "hi"}] and r.has_prompt
    assert not parse_body("chat", b'{"messages": "nope"}').has_prompt


@pytest.mark.parametrize("body, reason", [(b"not json", "invalid_json"), (b"\xff\xfe", "invalid_json"),
                                          (b"[1, 2]", "not_object"), (b"", "invalid_json")])
def test_bad_bodies(body: bytes, reason: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_body("completions", body)
    assert info.value.reason == reason


def test_prometheus_gauges() -> None:
    text = """# HELP vllm:num_requests_running Number of requests
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
vllm:num_requests_running_other 99
vllm:prefix_cache_hits_total{engine="0"} 1e3
"""
    assert parse_vllm_gauges(text) == {"running": 5.0, "waiting": 1.0, "kv_usage": 0.5}
    assert parse_vllm_gauges('vllm:gpu_cache_usage_perc{a="b"} 0.1\n') == {"kv_usage": 0.1}
    assert parse_vllm_gauges("garbage\n") == {}
