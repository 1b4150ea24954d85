"""End to end: session affinity through the real Envoy (envoy/envoy.yaml, BUFFERED) and the real sidecar with
`--session-header x-session-id`, over three simulated engines: a session's requests land on one engine while
concurrent requests without a session spread. All on free loopback addresses (no loopback lock).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator

import aiohttp
import pytest

from testkit.envoy import EnvoyProc
from testkit.envoy_eds import eds_config, write_assignment
from testkit.fleet import FleetProc
from testkit.ports import free_port
from testkit.sidecar import SidecarProc
from tests.e2e.discovery_helpers import free_fleet_address

pytestmark = pytest.mark.e2e

SESSION_HEADER = "x-session-id"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EnvoyProc, SidecarProc]]:
    log_dir = tmp_path_factory.mktemp("e2e-affinity")
    base_ip, port = free_fleet_address(3)
    sidecar_port = free_port()
    # leastload: without affinity, concurrent requests spread over the engines by their in-flight counts.
    with FleetProc(log_dir / "fleet", engines=3, base_ip=base_ip, port=port,
                   extra_args=["--decode-base-ms", "20"]) as fleet, \
            SidecarProc(["--listen", f"127.0.0.1:{sidecar_port}", "--metrics-listen", f"127.0.0.1:{free_port()}",
                         "--endpoints", ",".join(fleet.endpoints), "--policy", "leastload",
                         "--session-header", SESSION_HEADER], log_dir=log_dir / "sidecar") as sidecar:
        eds_dir = log_dir / "eds"
        eds_dir.mkdir()
        write_assignment(eds_dir, [(ep, "HEALTHY") for ep in fleet.endpoints], 1)
        config = eds_config(eds_dir, listen_port=free_port(), admin_port=free_port(), sidecar_port=sidecar_port)
        with EnvoyProc(config, log_dir / "envoy") as envoy:
            yield envoy, sidecar


async def post(http: aiohttp.ClientSession, url: str, session: str | None) -> str:
    body = {"prompt": f"{uuid.uuid4().hex} a question", "max_tokens": 10}
    headers = {SESSION_HEADER: session} if session else {}
    async with http.post(url + "/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        return resp.headers.get("x-served-by", "")


async def test_sessions_stay_on_their_engines_while_other_requests_spread(
        gateway: tuple[EnvoyProc, SidecarProc]) -> None:
    envoy, sidecar = gateway
    sessions = ["alice", "bob", "carol"]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        # Concurrent first requests spread the sessions over the engines (leastload on in-flight counts).
        homes = dict(zip(sessions, await asyncio.gather(*(post(http, envoy.url, s) for s in sessions))))
        # Others first, so every engine is busy when the sessions' second requests come: by load alone those
        # would go to the lexically first engine of the least loaded, not to each session's own.
        others = [asyncio.create_task(post(http, envoy.url, None)) for _ in range(6)]
        await asyncio.sleep(0.05)
        again = dict(zip(sessions, await asyncio.gather(*(post(http, envoy.url, s) for s in sessions))))
        spread = Counter(await asyncio.gather(*others))
    print(f"\nfirst: {homes}; second: {again}; others: {dict(spread)}")
    assert len(set(homes.values())) >= 2, homes  # the sessions started on different engines
    assert again == homes
    assert len(spread) >= 2, spread  # the rest spread over the engines
    affinity = Counter(d.get("affinity") for d in sidecar.debug_json("/debug/decisions?n=20"))
    assert affinity["new"] == 3 and affinity["kept"] == 3, affinity
