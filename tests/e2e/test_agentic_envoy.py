"""End to end: Responses follow-ups reach the engine that holds their state, and the Responses and Messages APIs
are decided by their prompt, through the real Envoy in both shipped deployments.

Two simulated engines keep stored responses per process as vLLM does (a follow-up anywhere else answers 404).
Three gateways share them: two BUFFERED replicas (envoy/envoy.yaml, each with its own sidecar) and the
InferencePool picker (envoy/envoy-inference-pool.yaml). All on free loopback addresses.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from testkit.envoy import EnvoyProc
from testkit.envoy_eds import eds_config, write_assignment
from testkit.fleet import FleetProc
from testkit.http import request
from testkit.paths import TINY_TOKENIZER
from testkit.ports import free_port
from testkit.sidecar import SidecarProc
from tests.e2e.discovery_helpers import free_fleet_address
from tests.e2e.test_endpoint_picker import picker_config

pytestmark = pytest.mark.e2e

CONVERSATIONS = 10


@dataclass
class Gateways:
    fleet: FleetProc
    buffered: str
    replica: str
    picker: str
    sidecars: dict[str, SidecarProc]


def _sidecar(log_dir: Path, name: str, fleet: FleetProc, port: int) -> SidecarProc:
    return SidecarProc(["--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{free_port()}",
                        "--endpoints", ",".join(fleet.endpoints), "--tokenizer", str(TINY_TOKENIZER)],
                       log_dir=log_dir / name)


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
    log_dir = tmp_path_factory.mktemp("e2e-agentic")
    base_ip, port = free_fleet_address(2)
    ports = {name: free_port() for name in ("buffered", "replica", "picker")}
    with FleetProc(log_dir / "fleet", engines=2, base_ip=base_ip, port=port) as fleet, \
            _sidecar(log_dir, "sidecar-buffered", fleet, ports["buffered"]) as s1, \
            _sidecar(log_dir, "sidecar-replica", fleet, ports["replica"]) as s2, \
            _sidecar(log_dir, "sidecar-picker", fleet, ports["picker"]) as s3:
        configs = {}
        for name in ("buffered", "replica"):
            eds_dir = log_dir / f"eds-{name}"
            eds_dir.mkdir()
            write_assignment(eds_dir, [(ep, "HEALTHY") for ep in fleet.endpoints], 1)
            configs[name] = eds_config(eds_dir, listen_port=free_port(), admin_port=free_port(),
                                       sidecar_port=ports[name])
        configs["picker"] = picker_config(log_dir / "picker.yaml", listen_port=free_port(), admin_port=free_port(),
                                          sidecar_port=ports["picker"], engines=fleet.endpoints)
        with EnvoyProc(configs["buffered"], log_dir / "envoy-buffered") as e1, \
                EnvoyProc(configs["replica"], log_dir / "envoy-replica") as e2, \
                EnvoyProc(configs["picker"], log_dir / "envoy-picker") as e3:
            yield Gateways(fleet, e1.url, e2.url, e3.url, {"buffered": s1, "replica": s2, "picker": s3})


async def create(http: aiohttp.ClientSession, url: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any], str]:
    """POST /v1/responses; (status, the response (the completed one, for a stream), the engine that served)."""
    async with http.post(url + "/v1/responses", json=payload) as resp:
        served = resp.headers.get("x-served-by", "")
        if not payload.get("stream") or resp.status != 200:
            return resp.status, await resp.json(content_type=None), served
        completed: dict[str, Any] = {}
        async for line in resp.content:
            if line.startswith(b"data: "):
                event = json.loads(line[6:])
                if event.get("type") == "response.completed":
                    completed = event["response"]
        return resp.status, completed, served


async def conversations(http: aiohttp.ClientSession, first_url: str, follow_url: str, stream: bool = False
                        ) -> list[tuple[int, str, str, str]]:
    """CONVERSATIONS first turns (stored) through `first_url`, then each one's follow-up through `follow_url`:
    (follow-up status, its id, the engine that made the first turn, the engine that served the follow-up)."""
    async def one(i: int) -> tuple[int, str, str, str]:
        status, first, made_by = await create(http, first_url, {
            "model": "tiny-model", "input": f"conversation {uuid.uuid4().hex} turn one", "store": True,
            "max_output_tokens": 8, "stream": stream})
        assert status == 200, first
        status, _, served = await create(http, follow_url, {
            "model": "tiny-model", "input": "and the second turn", "previous_response_id": first["id"],
            "max_output_tokens": 8})
        return status, first["id"], made_by, served
    return list(await asyncio.gather(*(one(i) for i in range(CONVERSATIONS))))


def assert_all_reached_their_state(results: list[tuple[int, str, str, str]]) -> None:
    statuses = [status for status, *_ in results]
    assert statuses == [200] * CONVERSATIONS, results
    assert all(made_by == served for _, _, made_by, served in results), results


@pytest.mark.parametrize("deployment", ["buffered", "picker"])
async def test_every_follow_up_reaches_its_state(gateways: Gateways, deployment: str) -> None:
    url = getattr(gateways, deployment)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        results = await conversations(http, url, url)
        # Only one engine holds a response: sent to the other, a follow-up meets vLLM's 404.
        rid = results[0][1]
        statuses = sorted(request("POST", f"http://{ep}/v1/responses", json.dumps(
            {"model": "tiny-model", "input": "x", "previous_response_id": rid, "max_output_tokens": 2}).encode())[0]
            for ep in gateways.fleet.endpoints)
        assert statuses == [200, 404]
    assert_all_reached_their_state(results)
    metrics = gateways.sidecars[deployment].metrics_text()
    assert 'loadaware_state_placements_total{rule="known"} 10.0' in metrics
    assert 'loadaware_api_requests_total{api="responses"} 20.0' in metrics


@pytest.mark.parametrize(("deployment", "rule"), [("buffered", "probed"), ("picker", "known")])
async def test_a_streamed_turns_state_is_found_too(gateways: Gateways, deployment: str, rule: str) -> None:
    """The picker reads the id from the stream's first event (the stream passes through it anyway); BUFFERED does
    not ask for an event stream's body (a message per event) and finds the holder by asking the engines."""
    url = getattr(gateways, deployment)
    before = gateways.sidecars[deployment].metrics_text()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        results = await conversations(http, url, url, stream=True)
    assert_all_reached_their_state(results)
    after = gateways.sidecars[deployment].metrics_text()
    assert placements(after, rule) - placements(before, rule) == CONVERSATIONS


def placements(page: str, rule: str) -> float:
    prefix = f'loadaware_state_placements_total{{rule="{rule}"}} '
    return next((float(line[len(prefix):]) for line in page.splitlines() if line.startswith(prefix)), 0.0)


async def test_a_replica_that_did_not_route_the_first_turn_finds_the_holder(gateways: Gateways) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        results = await conversations(http, gateways.buffered, gateways.replica)
        # A stored response's own paths, through the replica: GET answers it, cancel reaches the holder (which
        # refuses to cancel a finished synchronous response with a 400, as vLLM does: not a 404).
        rid = results[0][1]
        async with http.get(gateways.replica + f"/v1/responses/{rid}") as resp:
            assert resp.status == 200 and (await resp.json())["id"] == rid
        async with http.post(gateways.replica + f"/v1/responses/{rid}/cancel") as resp:
            assert resp.status == 400, await resp.text()
    assert_all_reached_their_state(results)
    metrics = gateways.sidecars["replica"].metrics_text()
    assert 'loadaware_state_placements_total{rule="probed"} 10.0' in metrics


async def test_messages_are_decided_by_their_prompt(gateways: Gateways) -> None:
    system = "You review pull requests for a storage engine. " * 30
    payload = {"model": "tiny-model", "max_tokens": 8, "system": system,
               "messages": [{"role": "user", "content": [{"type": "text", "text": "Is this diff safe?"}]}]}
    sidecar = gateways.sidecars["buffered"]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        served = []
        for _ in range(3):
            async with http.post(gateways.buffered + "/v1/messages", json=payload) as resp:
                body = await resp.json()
                assert resp.status == 200 and body["type"] == "message", body
                served.append(resp.headers.get("x-served-by"))
    decisions = [d for d in sidecar.debug_json("/debug/decisions") if d["prompt_tokens"] > 300]
    assert len(decisions) >= 3
    last = decisions[-1]
    # The repeat is credited the whole shared system prompt on the engine that served it before.
    assert max(c["matched_tokens"] for c in last["candidates"]) >= 300
    assert len(set(served[1:])) == 1
