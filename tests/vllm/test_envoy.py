"""Through real Envoy, in both deployments (envoy/envoy.yaml: the sidecar of an Envoy we configure;
envoy/envoy-inference-pool.yaml: the endpoint picker of an InferencePool), in front of the two real engines:
a repeated prompt lands on the engine holding it, and the sidecar's credit for it is what vLLM's own
vllm:prefix_cache_hits_total then counts."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit import http
from testkit.envoy import EnvoyProc
from testkit.paths import REPO
from testkit.ports import SIDECAR_PORT, free_ports
from testkit.sidecar import SidecarProc
from testkit.vllm import VllmEngine
from tests.conftest import wait_until
from tests.vllm.conftest import LOG_DIR, Hits, counter, vllm_hittable

WORDS = ["engine", "cache", "prefix", "token", "model", "latency", "load", "balance", "router", "gateway", "envoy",
         "cluster", "query", "answer", "document", "context", "summary", "question", "policy", "score", "matched",
         "prompt", "decode", "prefill", "batch"]


def envoy_config(base: Path, out: Path, engines: list[str], sidecar_port: int) -> Path:
    """The shipped config with its engines cluster = the real engines, on free listener/admin ports."""
    config: dict[str, Any] = yaml.safe_load(base.read_text())
    listen, admin = free_ports(2)
    config["admin"]["address"]["socket_address"]["port_value"] = admin
    config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] = listen
    for cluster in config["static_resources"]["clusters"]:
        endpoints = cluster["load_assignment"]["endpoints"][0]
        if cluster["name"] == "engines":
            endpoints["lb_endpoints"] = [
                {"endpoint": {"address": {"socket_address": {"address": ep.rpartition(":")[0],
                                                             "port_value": int(ep.rpartition(":")[2])}}}}
                for ep in engines]
        else:
            for lb in endpoints["lb_endpoints"]:
                address = lb["endpoint"]["address"]["socket_address"]
                if address["port_value"] == SIDECAR_PORT:
                    address["port_value"] = sidecar_port
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out


class Gateway:
    def __init__(self, mode: str, pair: tuple[VllmEngine, VllmEngine], model_dir: Path) -> None:
        a, b = pair
        self.engines = {a.endpoint: a, b.endpoint: b}
        (sidecar_port,) = free_ports(1)
        self.sidecar = SidecarProc(
            ["--listen", f"127.0.0.1:{sidecar_port}", "--endpoints", f"{a.endpoint},{b.endpoint}",
             "--tokenizer", str(model_dir), "--prefix-source", "kv-events", "--kv-events-port", "0",
             "--kv-events-endpoints", f"{a.endpoint}={a.kv_pub},{b.endpoint}={b.kv_pub}",
             "--metrics-listen", f"127.0.0.1:{free_ports(1)[0]}", "--policy", "loadaware"],
            log_dir=LOG_DIR / mode)
        base = REPO / "envoy" / ("envoy.yaml" if mode == "sidecar" else "envoy-inference-pool.yaml")
        config = envoy_config(base, LOG_DIR / mode / f"envoy-{mode}.yaml", list(self.engines), sidecar_port)
        self.envoy = EnvoyProc(config, LOG_DIR / mode)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        status, data = http.request("POST", self.envoy.url + path, json.dumps(body).encode(), timeout=120)
        assert status == 200, data[:300]
        out: dict[str, Any] = json.loads(data)
        return out

    def last_decision(self) -> dict[str, Any]:
        items = self.sidecar.debug_json("/debug/decisions?n=1")
        last: dict[str, Any] = items[-1] if items else {}
        return last

    def blocks(self, endpoint: str) -> int:
        state = self.sidecar.debug_json("/debug/state")
        return int(state["prefix"]["kv_events"]["engines"][endpoint]["blocks"])


@pytest.fixture(scope="module", params=["sidecar", "inference-pool"])
def gateway(request: pytest.FixtureRequest, pair: tuple[VllmEngine, VllmEngine],
            model_dir: Path) -> Iterator[Gateway]:
    g = Gateway(request.param, pair, model_dir)
    with g.sidecar, g.envoy:
        wait_until(lambda: all(e["connected"] for e in
                               g.sidecar.debug_json("/debug/state")["prefix"]["kv_events"]["engines"].values()),
                   timeout=30, message="the sidecar's feeds connected to both engines")
        yield g


def served_by(engines: dict[str, VllmEngine], before: dict[str, float]) -> list[str]:
    return [ep for ep, e in engines.items()
            if counter(e.metrics_text(), "vllm:request_success_total") > before[ep]]


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_repeat_lands_on_the_holder_and_credit_matches_vllm_hits(gateway: Gateway, kind: str) -> None:
    rng = random.Random(f"{kind}-{gateway.envoy.config_path.name}")
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
    first = gateway.post(path, body)
    (holder,) = served_by(engines, done)
    assert gateway.last_decision()["endpoint"] == holder
    tokens = first["usage"]["prompt_tokens"]
    size = engines[holder].block_size
    wait_until(lambda: gateway.blocks(holder) >= blocks[holder] + tokens // size, timeout=30,
               message="the sidecar indexed the holder's new blocks")
    hits = {ep: Hits(e) for ep, e in engines.items()}
    done = {ep: counter(e.metrics_text(), "vllm:request_success_total") for ep, e in engines.items()}
    gateway.post(path, body)
    assert served_by(engines, done) == [holder]
    decision = gateway.last_decision()
    assert decision["endpoint"] == holder and decision["prompt_tokens"] == tokens
    credit = {c["endpoint"]: c["matched_tokens"] for c in decision["candidates"]}
    assert credit[holder] == tokens // size * size > 0
    assert hits[holder].delta(tokens) == min(credit[holder], vllm_hittable(tokens, size))
    assert all(credit[ep] == 0 for ep in engines if ep != holder)
