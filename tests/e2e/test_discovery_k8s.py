"""Kubernetes discovery end to end: the real sidecar process (the `kubernetes` client's asyncio API) against a
local stand-in of the API server's EndpointSlice list/watch, with simulated engines that register with the
real LMCache controller under their pod names. Pod names become LMCache instance ids (credit follows them),
a dropped watch resumes from its resourceVersion, an expired one re-lists, and a terminating pod stops
getting traffic and credit at once."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.fleet import FleetProc
from testkit.k8s_apiserver import PodEndpoint, StandInApiServer, ThreadedStandIn, make_slice
from testkit.lmcache import LMCacheControllerProc
from testkit.ports import free_port
from testkit.require import requires_lmcache
from testkit.sidecar import SidecarProc
from tests.conftest import wait_until

from .discovery_helpers import free_fleet_address
from .grpcurl_cli import Grpcurl

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "sim" / "assets" / "tiny-model"
PODS = ("vllm-0", "vllm-1", "vllm-2")

pytestmark = [pytest.mark.e2e, requires_lmcache()]


class World:
    """The module's running parts: LMCache, the engines (pod names = instance ids) and the API stand-in."""

    lmcache: LMCacheControllerProc
    fleet: FleetProc
    api: StandInApiServer
    call: Callable[..., Any]
    ip: dict[str, str]
    endpoint: dict[str, str]
    port: int

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir

    def slice_(self, name: str, pods: list[tuple[str, bool, bool]]) -> dict[str, Any]:
        """pods: (pod name, ready, terminating)."""
        eps = [PodEndpoint(self.ip[p], p, ready=r, terminating=t, zone="zone-a") for p, r, t in pods]
        s = make_slice(name, "vllm", "llm", eps, self.port, port_name="http")
        s["ports"].append({"name": "metrics-sidecar", "protocol": "TCP", "port": 9999})  # not ours
        return s


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    log_dir = tmp_path_factory.mktemp("discovery-k8s")
    w = World(log_dir)
    standin = ThreadedStandIn(namespace="llm")
    base_ip, port = free_fleet_address(3)  # pod ips of our own: no queueing on the fixed-address lock
    with LMCacheControllerProc(log_dir) as lmcache, \
            FleetProc(log_dir, engines=3, base_ip=base_ip, port=port, lmcache=lmcache,
                      extra_args=["--names", ",".join(PODS)]) as fleet, \
            standin as api:
        w.lmcache, w.fleet, w.api = lmcache, fleet, api
        w.call = standin.call  # the stand-in lives on its own loop thread: its coroutines run there
        w.ip = {e["name"]: e["ip"] for e in fleet.engines}
        w.endpoint = {e["name"]: f"{e['ip']}:{e['port']}" for e in fleet.engines}
        w.port = fleet.engines[0]["port"]
        yield w


def test_kubernetes_discovery_end_to_end(world: World, tmp_path: Path) -> None:
    api = world.api
    call = world.call
    call(api.upsert(world.slice_("vllm-abcde", [("vllm-0", True, False), ("vllm-1", True, False)])))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(api.kubeconfig()))
    listen = f"127.0.0.1:{free_port()}"
    sidecar = SidecarProc(["--listen", listen, "--metrics-listen", "off", "--discovery", "kubernetes",
                           "--k8s-namespace", "llm", "--k8s-service", "vllm", "--k8s-port-name", "http",
                           "--kubeconfig", str(kubeconfig), "--lmcache-url", world.lmcache.url,
                           "--tokenizer", str(TOKENIZER), "--scrape-interval-s", "0.2", "--scrape-stale-s", "2"],
                          log_dir=tmp_path)
    with sidecar:  # started = health SERVING: the slices were listed and the pods scraped
        g = Grpcurl(sidecar.admin_listen)  # the debug API is on the admin port
        listed = g.call("loadaware.v1.Router/ListEndpoints")
        assert listed["discovery"] == "kubernetes" and listed["ready"] is True
        rows = {e["endpoint"]: e for e in listed["endpoints"]}
        assert set(rows) == {world.endpoint["vllm-0"], world.endpoint["vllm-1"]}  # the http port, not 9999
        for pod in ("vllm-0", "vllm-1"):
            row = rows[world.endpoint[pod]]
            assert row["pod"] == pod and row["lmcache_instance_id"] == pod and row["zone"] == "zone-a"
            assert row["routable"] and row["health"] == "HEALTHY"
        watches = [r for r in api.requests if r.watch]
        assert len(watches) == 1 and watches[0].params["labelSelector"] == "kubernetes.io/service-name=vllm"

        # A prefix warmed on vllm-1 is credited to it through the pod-name instance id.
        prompt = " ".join(f"cluster{i % 17} gateway prefix" for i in range(300))
        _post(f"http://{world.endpoint['vllm-1']}/v1/completions",
              {"model": "tiny-model", "prompt": prompt, "max_tokens": 2})
        request = {"body": {"model": "tiny-model", "prompt": prompt}}

        def credited() -> dict[str, Any] | None:
            reply = g.call("loadaware.v1.Router/Explain", request)
            by_ep = {e["endpoint"]: e for e in reply["endpoints"]}
            holder = by_ep[world.endpoint["vllm-1"]]
            # credited, and the scrape no longer shows the warming request running (even loads)
            return reply if holder["matched_tokens"] > 0 and holder["load"] == 0 else None

        reply = wait_until(credited, message="LMCache credit for vllm-1 at even loads")
        by_ep = {e["endpoint"]: e for e in reply["endpoints"]}
        assert by_ep[world.endpoint["vllm-1"]]["lmcache_instance_id"] == "vllm-1"
        assert reply["endpoint"] == world.endpoint["vllm-1"]

        # The watch is cut; meanwhile vllm-2 joins and vllm-1 starts terminating.
        seen_rv = watches[0].params.get("resourceVersion")
        call(api.drop_watches())
        call(api.upsert(world.slice_("vllm-abcde", [("vllm-0", True, False), ("vllm-1", False, True),
                                                     ("vllm-2", True, False)])))

        def moved() -> dict[str, Any] | None:
            rows = {e["endpoint"]: e for e in g.call("loadaware.v1.Router/ListEndpoints")["endpoints"]}
            ok = (rows.get(world.endpoint["vllm-2"], {}).get("routable")
                  and not rows[world.endpoint["vllm-1"]]["routable"])
            return rows if ok else None

        rows = wait_until(moved, message="the resumed watch to deliver the change")
        gone = rows[world.endpoint["vllm-1"]]
        assert gone["health"] == "DRAINING" and gone["health_detail"] == "terminating"
        watches = [r for r in api.requests if r.watch]
        lists = [r for r in api.requests if not r.watch]
        assert len(lists) == 1 and len(watches) == 2  # resumed, not re-listed
        assert int(watches[1].params["resourceVersion"]) >= int(seen_rv or 0)
        # the terminating pod gets neither traffic nor credit any more
        reply = g.call("loadaware.v1.Router/Explain", request)
        assert world.endpoint["vllm-1"] not in {e["endpoint"] for e in reply["endpoints"]}
        assert reply["endpoint"] != world.endpoint["vllm-1"]

        # History compacted while disconnected: 410 Expired, a fresh list, and the state is right again.
        call(api.drop_watches())
        call(api.delete("vllm-abcde"))
        call(api.upsert(world.slice_("vllm-fghij", [("vllm-2", True, False)])))
        call(_compact(api))
        wait_until(lambda: [e["endpoint"] for e in g.call("loadaware.v1.Router/ListEndpoints")["endpoints"]]
                   == [world.endpoint["vllm-2"]], message="the re-list after 410")
        assert len([r for r in api.requests if not r.watch]) == 2


async def _compact(api: Any) -> None:
    api.compact()


def _post(url: str, body: Any) -> None:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        assert resp.status == 200
