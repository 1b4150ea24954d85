"""Through real Envoy, in both deployments (envoy/envoy.yaml: the sidecar of an Envoy we configure;
envoy/envoy-inference-pool.yaml: the endpoint picker of an InferencePool), in front of the two real engines:
a repeated prompt lands on the engine holding it, and the sidecar's credit for it is what vLLM's own
vllm:prefix_cache_hits_total then counts."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.vllm import VllmEngine
from testkit.vllm_gateway import VllmGateway
from tests.conftest import wait_until
from tests.vllm.conftest import LOG_DIR, Hits, counter, vllm_hittable

WORDS = ["engine", "cache", "prefix", "token", "model", "latency", "load", "balance", "router", "gateway", "envoy",
         "cluster", "query", "answer", "document", "context", "summary", "question", "policy", "score", "matched",
         "prompt", "decode", "prefill", "batch"]


@pytest.fixture(scope="module", params=["sidecar", "inference-pool"])
def gateway(request: pytest.FixtureRequest, pair: tuple[VllmEngine, VllmEngine],
            model_dir: Path) -> Iterator[VllmGateway]:
    with VllmGateway(pair, model_dir, LOG_DIR / request.param, mode=request.param) as g:
        wait_until(g.connected, timeout=30, message="the sidecar's feeds connected to both engines")
        yield g


def served_by(engines: dict[str, VllmEngine], before: dict[str, float]) -> list[str]:
    return [ep for ep, e in engines.items()
            if counter(e.metrics_text(), "vllm:request_success_total") > before[ep]]


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_repeat_lands_on_the_holder_and_credit_matches_vllm_hits(gateway: VllmGateway, kind: str) -> None:
    rng = random.Random(f"{kind}-{gateway.mode}")
    text = " ".join(rng.choice(WORDS) for _ in range(260))
    body: dict[str, Any]
    if kind == "completions":
        path, body = "/v1/completions", {"prompt": text}
    else:
        path, body = "/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."},
                                                           {"role": "user", "content": text}]}
    body = {"model": "tiny-llama", "max_tokens": 1, "temperature": 0, **body}
    engines = gateway.engines
    done = {ep: counter(e.metrics_text(), "vllm:request_success_total") for ep, e in engines.items()}
    blocks = {ep: gateway.blocks(ep) for ep in engines}
    status, first = gateway.post(path, body)
    assert status == 200, first
    (holder,) = served_by(engines, done)
    assert gateway.last_decision()["endpoint"] == holder
    tokens = first["usage"]["prompt_tokens"]
    size = engines[holder].block_size
    wait_until(lambda: gateway.blocks(holder) >= blocks[holder] + tokens // size, timeout=30,
               message="the sidecar indexed the holder's new blocks")
    hits = {ep: Hits(e) for ep, e in engines.items()}
    done = {ep: counter(e.metrics_text(), "vllm:request_success_total") for ep, e in engines.items()}
    assert gateway.post(path, body)[0] == 200
    assert served_by(engines, done) == [holder]
    decision = gateway.last_decision()
    assert decision["endpoint"] == holder and decision["prompt_tokens"] == tokens
    credit = {c["endpoint"]: c["matched_tokens"] for c in decision["candidates"]}
    assert credit[holder] == tokens // size * size > 0
    assert hits[holder].delta(tokens) == min(credit[holder], vllm_hittable(tokens, size))
    assert all(credit[ep] == 0 for ep in engines if ep != holder)
