"""The engines-connect pattern against real vLLM: engine C's `endpoint` is the sidecar's bound SUB socket
(`tcp://<sidecar>:PORT`, as llm-d deploys it), its topic `kv@127.0.0.2@tiny-llama` names it. C has a
deliberately small KV cache (evictions publish BlockRemoved), serves a LoRA adapter, and is restarted last."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadaware.fleet.models import parse_models
from tests.conftest import wait_until
from tests.vllm.conftest import C_HOST, Fleet, Hits, KvView, complete, full_blocks, token_prompt


class Connected:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.engine = fleet.c
        self.view = self.new_view()

    def new_view(self) -> KvView:
        """A sidecar binding C's socket, once C is known to it. The engine's PUB socket reconnects on its own
        schedule and drops what it publishes before the view's subscription arrives (ZeroMQ's slow joiner),
        so throwaway requests are sent until one batch gets through: the engine is known from it."""
        kv = self.engine.kv_events
        assert kv is not None
        view = KvView([self.engine.endpoint], bind=f"127.0.0.1:{self.fleet.c_bind_port}",
                      replay_port=kv.replay_port or 0)
        sent = iter(range(1000, 2000))

        def known() -> bool:
            complete(self.engine, token_prompt(next(sent), 40))
            return view.covered() == {self.engine.endpoint}
        wait_until(known, timeout=60, interval=0.5, message="engine C's first KV-event batch reached the view")
        return view


@pytest.fixture(scope="module")
def connected(fleet: Fleet) -> Iterator[Connected]:
    c = Connected(fleet)
    try:
        yield c
    finally:
        c.view.close()


def test_connecting_engine_is_credited_by_its_topic(connected: Connected) -> None:
    c, view = connected.engine, connected.view
    prompt = token_prompt(201, 6 * 32 + 9)
    complete(c, prompt)
    view.wait_credit(prompt, {c.endpoint: 192})
    assert view.covered() == {c.endpoint}
    assert view.inbound is not None and view.inbound.state()["topics"] == {f"kv@{C_HOST}@tiny-llama": c.endpoint}
    hits = Hits(c)
    complete(c, prompt)
    assert hits.delta(len(prompt)) == 192


def test_lora_adapter_is_listed_and_its_blocks_never_credit_the_base(connected: Connected) -> None:
    c, view = connected.engine, connected.view
    models = parse_models(c.get_json("/v1/models"))
    assert models.ids == {"tiny-llama", "tiny-lora"}
    assert dict(models.parents) == {"tiny-lora": "tiny-llama"}
    prompt = token_prompt(202, 3 * 32 + 1)
    stored = view.metrics.kv_event_blocks.labels("stored")._value.get()
    reply = c.post("/v1/completions", {"model": "tiny-lora", "prompt": prompt, "max_tokens": 1})
    assert reply["usage"]["prompt_tokens"] == len(prompt)
    # vLLM publishes the adapter's name in the blocks' extra_keys: no request's plain walk reproduces them.
    wait_until(lambda: view.metrics.kv_event_blocks.labels("stored")._value.get() >= stored + 3, timeout=30,
               message="the LoRA blocks arrived")
    assert view.credit(prompt) == {}
    hits = Hits(c)
    complete(c, prompt)  # the base model shares nothing with the adapter's blocks either
    assert hits.delta(len(prompt)) == 0


def test_small_cache_evicts_and_removed_blocks_lose_credit(connected: Connected) -> None:
    c, view = connected.engine, connected.view
    prompt = token_prompt(203, 5 * 32 + 3)
    complete(c, prompt)
    view.wait_credit(prompt, {c.endpoint: 160})
    removed_before = view.metrics.kv_event_blocks.labels("removed")._value.get()
    for i in range(4):  # 4 x 14 blocks through a 48-block cache: the oldest blocks are evicted
        complete(c, token_prompt(210 + i, 14 * 32 + 5))
    wait_until(lambda: view.credit(prompt).get(c.endpoint, 0) < 160, timeout=30, message="credit removed")
    assert view.metrics.kv_event_blocks.labels("removed")._value.get() > removed_before
    view.wait_settled()  # the first removal seen need not be the last one published
    credited = view.credit(prompt).get(c.endpoint, 0)
    hits = Hits(c)
    complete(c, prompt)
    assert hits.delta(len(prompt)) == credited  # what is left credited is what vLLM still holds


def test_a_restarted_sidecar_replays_from_the_engine(connected: Connected) -> None:
    c = connected.engine
    prompt = token_prompt(204, 4 * 32 + 2)
    complete(c, prompt)
    connected.view.wait_credit(prompt, {c.endpoint: 128})
    connected.view.close()  # the sidecar goes away; the engine's PUB socket keeps reconnecting
    connected.view = late = connected.new_view()
    # An engine is known from its first message: that batch shows a join, and the replay brings the rest.
    late.wait_credit(prompt, {c.endpoint: 128})
    assert late.metrics.kv_replays.labels("join", "ok")._value.get() >= 1


def test_engine_restart_clears_its_credit(connected: Connected) -> None:
    c, view = connected.engine, connected.view
    prompt = token_prompt(206, 3 * 32 + 4)
    complete(c, prompt)
    view.wait_credit(prompt, {c.endpoint: 96})
    c.stop()
    view.wait_credit(prompt, {}, timeout=60)  # its connection closed: no credit for what it no longer holds
    assert view.covered() == set()
    c.proc = None
    c.start()
    hits = Hits(c)
    complete(c, prompt)
    assert hits.delta(len(prompt)) == 0  # a fresh engine holds nothing: the cleared index was right
    view.wait_credit(prompt, {c.endpoint: full_blocks(len(prompt), 32)})  # its new events (numbered from 0)
