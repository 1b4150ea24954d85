"""End to end: admission under saturation through the real Envoy in both ext_proc modes (envoy/envoy.yaml's
BUFFERED, and envoy-inference-pool.yaml's FULL_DUPLEX_STREAMED picker), the real sidecar process with
`--admission on` and an objectives file, over two simulated engines made to queue with phantom waiting counts.

While both engines queue, a sheddable request (objective batch, priority -1) is held for its time to live and
then answered 429 with Retry-After and the reason header; a critical and a standard request are held; when one
engine's queue empties the critical one is released first, onto that engine, and answered 200. In BUFFERED mode
Envoy honours the sidecar's extension of its message timer (its override_message_timeout counters say so).
All on free loopback addresses.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from testkit.envoy import EnvoyProc
from testkit.envoy_eds import eds_config, write_assignment
from testkit.fleet import FleetProc
from testkit.metrics_text import metric_sum
from testkit.paths import REPO
from testkit.ports import free_port
from testkit.sidecar import SidecarProc
from tests.conftest import wait_until
from tests.e2e.discovery_helpers import free_fleet_address
from tests.e2e.test_endpoint_picker import picker_config

pytestmark = pytest.mark.e2e

TTL_S = 3.0
OBJECTIVES = {"critical": {"priority": 10}, "standard": {"priority": 0}, "batch": {"priority": -1}}


class Rig:
    def __init__(self, fleet: FleetProc, sidecar: SidecarProc, metrics: str, gateways: dict[str, EnvoyProc]) -> None:
        self.fleet = fleet
        self.sidecar = sidecar
        self.metrics = metrics
        self.gateways = gateways

    def queue(self, endpoint: str, waiting: int) -> None:
        req = urllib.request.Request(f"http://{endpoint}/sim/phantom_load", method="POST",
                                     data=json.dumps({"running": 2 if waiting else 0, "waiting": waiting}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200

    def state(self) -> dict[str, object]:
        with urllib.request.urlopen(f"{self.sidecar.debug_url}/debug/state", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def scraped_waiting(self) -> dict[str, float | None]:
        rows = self.state()["endpoints"]
        assert isinstance(rows, list)
        return {r["endpoint"]: None if r["scraped"] is None else r["scraped"]["waiting"] for r in rows}

    def wait_scraped(self, waiting: dict[str, int]) -> None:
        wait_until(lambda: all(self.scraped_waiting().get(ep) == n for ep, n in waiting.items()),
                   message=lambda: f"the sidecar to scrape waiting={waiting} (it has {self.scraped_waiting()})")

    def held(self) -> int:
        admission = self.state()["admission"]
        assert isinstance(admission, dict)
        return int(admission["held"])

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5) as resp:
            return str(resp.read().decode())


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    log_dir = tmp_path_factory.mktemp("e2e-admission")
    objectives = log_dir / "objectives.json"
    objectives.write_text(json.dumps(OBJECTIVES))
    base_ip, port = free_fleet_address(2)
    sidecar_port, metrics = free_port(), f"127.0.0.1:{free_port()}"
    with FleetProc(log_dir / "fleet", engines=2, base_ip=base_ip, port=port,
                   extra_args=["--decode-base-ms", "5"]) as fleet, \
            SidecarProc(["--listen", f"127.0.0.1:{sidecar_port}", "--metrics-listen", metrics,
                         "--endpoints", ",".join(fleet.endpoints), "--policy", "leastload",
                         "--admission", "on", "--objectives", str(objectives), "--admission-ttl-s", str(TTL_S),
                         "--scrape-interval-s", "0.1", "--scrape-stale-s", "2"],
                        log_dir=log_dir / "sidecar") as sidecar:
        eds_dir = log_dir / "eds"
        eds_dir.mkdir()
        write_assignment(eds_dir, [(ep, "HEALTHY") for ep in fleet.endpoints], 1)
        buffered = eds_config(eds_dir, listen_port=free_port(), admin_port=free_port(), sidecar_port=sidecar_port)
        picker = picker_config(log_dir / "picker.yaml", listen_port=free_port(), admin_port=free_port(),
                               sidecar_port=sidecar_port, engines=list(fleet.endpoints))
        with EnvoyProc(buffered, log_dir / "envoy-buffered") as envoy_buffered, \
                EnvoyProc(picker, log_dir / "envoy-picker") as envoy_picker:
            yield Rig(fleet, sidecar, metrics, {"buffered": envoy_buffered, "picker": envoy_picker})


async def post(http: aiohttp.ClientSession, url: str, objective: str) -> tuple[int, dict[str, str], str, float]:
    """(status, headers, the engine that served, seconds) for one completion with this objective."""
    started = time.monotonic()
    body = {"model": "tiny-model", "prompt": f"{objective} question", "max_tokens": 2}
    async with http.post(url + "/v1/completions", json=body,
                         headers={"x-gateway-inference-objective": objective,
                                  "x-gateway-inference-fairness-id": "tenant-a"}) as resp:
        await resp.read()
        headers = {k.lower(): v for k, v in resp.headers.items()}
        return resp.status, headers, resp.headers.get("x-served-by", ""), time.monotonic() - started


@pytest.mark.parametrize("mode", ["buffered", "picker"])
async def test_a_saturated_pool_sheds_sheddable_work_and_releases_the_critical_first(rig: Rig, mode: str) -> None:
    envoy = rig.gateways[mode]
    a, b = rig.fleet.endpoints
    try:
        for ep in (a, b):
            rig.queue(ep, 3)
        rig.wait_scraped({a: 3, b: 3})
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            batch = asyncio.create_task(post(http, envoy.url, "batch"))
            await asyncio.sleep(0.2)
            critical = asyncio.create_task(post(http, envoy.url, "critical"))
            standard = asyncio.create_task(post(http, envoy.url, "standard"))
            await asyncio.sleep(0.5)
            assert rig.held() == 3 and not critical.done() and not batch.done()
            rig.queue(a, 0)  # engine a's queue empties: room for one
            status, _, served, waited = await asyncio.wait_for(critical, 10)
            assert status == 200 and served.startswith("engine") and waited > 0.5
            assert not batch.done()  # the batch request, held first, waits behind the critical one
            rig.queue(b, 0)
            status, _, _, _ = await asyncio.wait_for(standard, 10)
            assert status == 200
            # batch: released too (room) or shed at its time to live; saturate again to see it shed
            status, headers, _, waited = await asyncio.wait_for(batch, TTL_S + 10)
            assert status == 200
            for ep in (a, b):
                rig.queue(ep, 3)
            rig.wait_scraped({a: 3, b: 3})
            status, headers, _, waited = await post(http, envoy.url, "batch")
        assert status == 429, headers
        assert int(headers["retry-after"]) >= 1
        assert headers["x-loadaware-request-dropped-reason"] == "rejected_ttl"
        assert TTL_S - 0.5 < waited < TTL_S + 5
        assert rig.held() == 0
    finally:
        for ep in (a, b):
            rig.queue(ep, 0)
    text = rig.metrics_text()
    assert metric_sum(text, "loadaware_flow_control_requests_total", {"outcome": "rejected_ttl", "priority": "-1"}) >= 1
    assert metric_sum(text, "loadaware_flow_control_requests_total", {"outcome": "released", "priority": "10"}) >= 1
    if mode == "buffered":
        stats = envoy.stats()
        received = sum(v for k, v in stats.items() if k.endswith("ext_proc.override_message_timeout_received"))
        ignored = sum(v for k, v in stats.items() if k.endswith("ext_proc.override_message_timeout_ignored"))
        assert received >= 4 and ignored == 0, {k: v for k, v in stats.items() if "override" in k}


def test_a_bad_objectives_file_stops_the_sidecar_at_start_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "objectives.json"
    bad.write_text(json.dumps({"batch": {"priority": "low"}}))
    result = subprocess.run([sys.executable, "-c", "import sys; from loadaware.cli import main; sys.exit(main())",
                             "serve", "--endpoints", "127.0.0.2:8000", "--metrics-listen", "off",
                             "--admission", "on", "--objectives", str(bad)],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2
    assert "--objectives" in result.stderr and "priority must be an integer" in result.stderr
