"""KV events from real vLLM (bind pattern: each engine binds its PUB socket on loopback, the sidecar connects):
the credit is exactly what vLLM's own prefix cache then hits, at block sizes 32 and 64; a late-joining sidecar
replays what it missed; cache_salt requests are credited only by blocks stored under the same salt, with the
extra_keys vLLM really publishes."""

from __future__ import annotations

from testkit.vllm import VllmEngine
from tests.conftest import wait_until
from tests.vllm.conftest import Hits, KvView, complete, full_blocks, token_prompt


def test_credit_is_what_vllm_then_hits(pair: tuple[VllmEngine, VllmEngine], kv_view: KvView) -> None:
    a, b = pair
    for engine, other, seed in ((a, b, 101), (b, a, 102)):
        prompt = token_prompt(seed, 9 * 64 + 21)  # not a whole number of blocks: vLLM can hit every full one
        complete(engine, prompt)
        want = full_blocks(len(prompt), engine.block_size)
        kv_view.wait_credit(prompt, {engine.endpoint: want})
        # vLLM's own counter on the same prompt again: it hits exactly the credited tokens; the other engine,
        # credited nothing, hits nothing.
        hits = Hits(engine)
        complete(engine, prompt)
        assert hits.delta(len(prompt)) == want
        other_hits = Hits(other)
        complete(other, prompt)
        assert other_hits.delta(len(prompt)) == 0
        kv_view.wait_credit(prompt, {engine.endpoint: want, other.endpoint: full_blocks(len(prompt), other.block_size)})


def test_shared_prefix_credit_is_per_block(pair: tuple[VllmEngine, VllmEngine], kv_view: KvView) -> None:
    a, b = pair
    base = token_prompt(103, 300)
    complete(a, base)
    complete(b, base)
    branch = base[:200] + token_prompt(104, 90)  # shares 200 tokens: 6 blocks of 32, 3 of 64
    want = {a.endpoint: full_blocks(200, 32), b.endpoint: full_blocks(200, 64)}
    kv_view.wait_credit(branch, want)
    for engine in (a, b):
        hits = Hits(engine)
        complete(engine, branch)
        assert hits.delta(len(branch)) == want[engine.endpoint]


def test_late_joining_sidecar_replays(pair: tuple[VllmEngine, VllmEngine], kv_view: KvView) -> None:
    a, b = pair
    prompt = token_prompt(105, 5 * 32 + 7)
    complete(a, prompt)
    kv_view.wait_credit(prompt, {a.endpoint: 160})
    late = KvView([a.endpoint, b.endpoint], feed_map=f"{a.endpoint}={a.kv_pub},{b.endpoint}={b.kv_pub}")
    try:
        # Nothing is published after it joins: the credit can only come from the replay socket.
        late.wait_credit(prompt, {a.endpoint: 160})
        assert late.metrics.kv_replays.labels("join", "ok")._value.get() >= 1
    finally:
        late.close()


def test_cache_salt_blocks_credit_only_the_same_salt(pair: tuple[VllmEngine, VllmEngine], kv_view: KvView) -> None:
    a, _ = pair
    prompt = token_prompt(106, 4 * 32 + 3)
    complete(a, prompt, cache_salt="tenant-a")
    kv_view.wait_credit(prompt, {a.endpoint: 128}, salt="tenant-a")
    assert kv_view.credit(prompt) == {}  # unsalted: none
    assert kv_view.credit(prompt, salt="tenant-b") == {}
    for salt, want in (("tenant-b", 0), (None, 0), ("tenant-a", 128)):  # vLLM agrees
        hits = Hits(a)
        complete(a, prompt, **({"cache_salt": salt} if salt else {}))
        assert hits.delta(len(prompt)) == want, salt
    # The unsalted and tenant-b sends above stored their own chains: each credits its own kind only.
    wait_until(lambda: kv_view.credit(prompt) == {a.endpoint: 128}, timeout=30, message="unsalted credit")
    assert kv_view.credit(prompt, salt="tenant-b") == {a.endpoint: 128}
    assert kv_view.credit(prompt, salt="tenant-c") == {}
