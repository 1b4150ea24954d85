"""End to end: two models behind one gateway, through the real Envoy in both ext_proc modes.

Three simulated engines: two serve model-a, one serves model-b (also named b-chat) with a LoRA adapter
b-sql. One sidecar (it reads each engine's /v1/models) serves two Envoys: envoy/envoy.yaml (BUFFERED) and
envoy/envoy-inference-pool.yaml (the picker's full-duplex mode). Every request for model-b or its adapter
lands on model-b's engine; model-a's spread over model-a's two engines; a model nobody serves gets vLLM's
404 JSON from the gateway and reaches no engine. All on free loopback addresses (no loopback lock).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from testkit.envoy import EnvoyProc
from testkit.envoy_eds import eds_config, write_assignment
from testkit.fleet import FleetProc
from testkit.paths import TINY_TOKENIZER
from testkit.ports import free_port
from testkit.sidecar import SidecarProc
from tests.conftest import wait_until
from tests.e2e.discovery_helpers import free_fleet_address
from tests.e2e.test_endpoint_picker import start_envoy

pytestmark = pytest.mark.e2e

MODELS = "model-a;model-a;model-b,b-chat+b-sql=/loras/sql"
NOT_FOUND = {"error": {"message": "The model `gpt-nope` does not exist.", "type": "NotFoundError",
                       "param": "model", "code": 404}}


class Models:
    def __init__(self, fleet: FleetProc, sidecar: SidecarProc) -> None:
        self.fleet = fleet
        self.sidecar = sidecar
        self.envoys: dict[str, EnvoyProc] = {}
        names = [e["name"] for e in fleet.engines]
        self.a_engines, self.b_engine = set(names[:2]), names[2]

    def upstream_requests(self, mode: str) -> int:
        """Requests Envoy sent to any engine (an engine's own 404 for a model it lacks would count here too:
        the engine answers it before any of its own stats, and with the same body as the gateway's)."""
        return int(self.envoys[mode].stats().get("cluster.engines.upstream_rq_total", 0))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Models]:
    log_dir = tmp_path_factory.mktemp("e2e-models")
    base_ip, port = free_fleet_address(3)
    sidecar_port = free_port()
    with FleetProc(log_dir / "fleet", engines=3, base_ip=base_ip, port=port,
                   extra_args=["--models", MODELS, "--decode-base-ms", "10"]) as fleet, \
            SidecarProc(["--listen", f"127.0.0.1:{sidecar_port}", "--metrics-listen", f"127.0.0.1:{free_port()}",
                         "--endpoints", ",".join(fleet.endpoints), "--tokenizer", str(TINY_TOKENIZER),
                         "--prefix-source", "approx", "--models-refresh-s", "1"], log_dir=log_dir / "sidecar") as sc:
        stack = Models(fleet, sc)
        eds_dir = log_dir / "eds"
        eds_dir.mkdir()
        write_assignment(eds_dir, [(ep, "HEALTHY") for ep in fleet.endpoints], 1)
        config = eds_config(eds_dir, listen_port=free_port(), admin_port=free_port(), sidecar_port=sidecar_port)
        with EnvoyProc(config, log_dir / "envoy-buffered") as buffered, \
                start_envoy(Path(log_dir), "envoy-picker", sidecar_port, fleet.endpoints) as picker:
            stack.envoys = {"buffered": buffered, "picker": picker}
            wait_until(lambda: all(row["models"] for row in sc.debug_json("/debug/state")["endpoints"]),
                       message="the sidecar to know every engine's models")
            yield stack


async def post(http: aiohttp.ClientSession, url: str, model: str, max_tokens: int = 20) -> tuple[int, str, Any]:
    body = {"model": model, "prompt": f"{uuid.uuid4().hex} question about {model}", "max_tokens": max_tokens}
    async with http.post(url + "/v1/completions", json=body) as resp:
        return resp.status, resp.headers.get("x-served-by", ""), await resp.json(content_type=None)


@pytest.mark.parametrize("mode", ["buffered", "picker"])
async def test_requests_go_to_their_models_engines_and_an_unknown_model_gets_404(stack: Models, mode: str) -> None:
    url = stack.envoys[mode].url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        # Concurrent, so in-flight counts spread model-a's requests over its engines.
        sent = ["model-a"] * 8 + ["model-b"] * 3 + ["b-chat"] * 2 + ["b-sql"] * 3
        replies = await asyncio.gather(*(post(http, url, model) for model in sent))
        assert all(status == 200 for status, _, _ in replies), replies
        by_model: dict[str, Counter[str]] = {}
        for model, (_, served_by, _) in zip(sent, replies):
            by_model.setdefault(model, Counter())[served_by] += 1
        for model in ("model-b", "b-chat", "b-sql"):
            assert by_model[model] == Counter({stack.b_engine: sent.count(model)}), by_model
        print(f"\n{mode}: served by model " + "; ".join(f"{m}: {dict(c)}" for m, c in by_model.items()))
        a = by_model["model-a"]
        assert set(a) == stack.a_engines and min(a.values()) >= 2, by_model  # both of model-a's, only them

        upstream = stack.upstream_requests(mode)
        assert upstream >= len(sent)
        status, _, body = await post(http, url, "gpt-nope")
        assert (status, body) == (404, NOT_FOUND)
        assert stack.upstream_requests(mode) == upstream  # no engine saw it
        print(f"{mode}: gpt-nope -> {status} {body!r}; upstream requests before/after: {upstream}/"
              f"{stack.upstream_requests(mode)}")
    decisions = stack.sidecar.debug_json("/debug/decisions?n=1")
    assert decisions[0]["outcome"] == "unknown_model" and decisions[0]["endpoint"] is None
