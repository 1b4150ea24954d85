"""IPv6 end to end: three simulated engines on [::1] (each its own port) behind the real Envoy, whose engines
cluster lists them and whose ext_proc cluster dials the sidecar on [::1]; the sidecar listens, serves its
admin pages and gRPC API on [::1], scrapes http://[::1]:port/metrics, polls /v1/models and subscribes to the
engines' KV events on tcp://[::1]:port. Run with the fleet given as `--endpoints [::1]:a,...`, found through
Envoy's admin API (--discovery envoy-admin), through IPv6 EndpointSlices (--discovery kubernetes) and through
an InferencePool's pod (--discovery inference-pool), the last two from a stand-in Kubernetes API server.

What must hold: the endpoints keep their brackets everywhere; Envoy's override_host honours the sidecar's
`[::1]:port` destination (every request lands on the engine the sidecar chose, and Envoy reports that engine
back in the same spelling); scrapes, model lists and KV events reach the sidecar."""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import struct_pb2

from loadaware.api.v1 import loadaware_pb2 as pb
from loadaware.fleet.addresses import format_hostport, http_url
from testkit.envoy import EnvoyProc
from testkit.envoy_eds import eds_config, write_assignment
from testkit.fleet import FleetProc
from testkit.k8s_apiserver import PodEndpoint, ThreadedStandIn, make_pod, make_pool, make_slice
from testkit.lmcache import LMCacheControllerProc
from testkit.paths import TINY_TOKENIZER
from testkit.ports import free_port
from testkit.require import require, requires_lmcache
from testkit.sidecar import SidecarProc
from tests.conftest import wait_until

from .discovery_helpers import RouterClient

pytestmark = pytest.mark.e2e

WORDS = ["the", "engine", "cache", "prefix", "token", "model", "latency", "load", "gateway", "envoy", "router"]


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@dataclass
class World:
    fleet: FleetProc
    envoy: EnvoyProc
    sidecar: SidecarProc
    router: RouterClient
    by_name: dict[str, str]  # engine name -> its endpoint, [::1]:port

    def decisions(self, n: int = 200) -> list[dict[str, Any]]:
        return list(self.sidecar.debug_json(f"/debug/decisions?n={n}"))

    def state(self) -> dict[str, Any]:
        return dict(self.sidecar.debug_json("/debug/state"))

    def phantom(self, name: str, running: int) -> None:
        req = urllib.request.Request(http_url(self.by_name[name], "/sim/phantom_load"), method="POST",
                                     data=json.dumps({"running": running, "waiting": 0}).encode(),
                                     headers={"content-type": "application/json"})
        urllib.request.urlopen(req, timeout=5).read()

    def complete(self, prompt: str, request_id: str) -> str:
        """POST through Envoy; the name of the engine that answered."""
        req = urllib.request.Request(self.envoy.url + "/v1/completions", method="POST",
                                     data=json.dumps({"model": "tiny-model", "prompt": prompt,
                                                      "max_tokens": 2}).encode(),
                                     headers={"content-type": "application/json", "x-request-id": request_id})
        with urllib.request.urlopen(req, timeout=20) as resp:
            assert resp.status == 200
            return str(resp.headers["x-served-by"])

    def decision(self, request_id: str) -> dict[str, Any]:
        """The sidecar's record of one request, once its response has reported who served it."""
        def found() -> dict[str, Any] | None:
            mine = [d for d in self.decisions() if d["request_id"] == request_id]
            return mine[0] if mine and mine[0]["status"] else None
        return wait_until(found, message=f"the decision of {request_id} with its response")


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FleetProc, EnvoyProc, int, Path]]:
    require("IPv6 loopback (::1)", ipv6_loopback(), "enable IPv6 on the loopback interface")
    log_dir = tmp_path_factory.mktemp("e2e-ipv6")
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(FleetProc(log_dir, engines=3, base_ip="::1", port=0, extra_args=[
            "--kv-events", "--kv-events-port", "0", "--kv-events-replay-port", "0"]))
        assert all(ep.startswith("[::1]:") for ep in fleet.endpoints), fleet.endpoints
        eds_dir = log_dir / "eds"
        eds_dir.mkdir()
        write_assignment(eds_dir, [(ep, "HEALTHY") for ep in fleet.endpoints], 1)
        sidecar_port = free_port("::1")
        config = eds_config(eds_dir, listen_port=free_port(), admin_port=free_port(), sidecar_port=sidecar_port,
                            sidecar_host="::1")
        envoy = stack.enter_context(EnvoyProc(config, log_dir))
        yield fleet, envoy, sidecar_port, log_dir


def discovery_args(mode: str, fleet: FleetProc, envoy: EnvoyProc, stack: contextlib.ExitStack,
                   log_dir: Path) -> list[str]:
    """The sidecar's flags to find the [::1] engines by `mode`; the Kubernetes modes get a stand-in API
    server whose EndpointSlices (addressType IPv6) or pod and InferencePool name ::1."""
    if mode == "static":
        return ["--endpoints", ",".join(fleet.endpoints)]
    if mode == "envoy-admin":
        return ["--discovery", "envoy-admin", "--envoy-admin-url", envoy.admin_url, "--discovery-interval-s", "0.2"]
    standin = ThreadedStandIn(namespace="llm")
    api = stack.enter_context(standin)
    kubeconfig = log_dir / f"kubeconfig-{mode}"
    kubeconfig.write_text(json.dumps(api.kubeconfig()))
    if mode == "kubernetes":
        for e in fleet.engines:  # one slice per engine: each its own port on the one IPv6 loopback address
            slice_ = make_slice(f"vllm-{e['name']}", "vllm", "llm", [PodEndpoint(e["ip"], e["name"])], e["port"])
            slice_["addressType"] = "IPv6"
            standin.call(api.upsert(slice_))
        return ["--discovery", "kubernetes", "--k8s-namespace", "llm", "--k8s-service", "vllm",
                "--k8s-port-name", "http", "--kubeconfig", str(kubeconfig)]
    assert mode == "inference-pool"
    standin.call(api.upsert_pod(make_pod("vllm-0", "::1", {"app": "vllm"})))  # one pod, a target port per engine
    api.set_pool(make_pool("vllm", {"app": "vllm"}, [e["port"] for e in fleet.engines]))
    return ["--discovery", "inference-pool", "--inference-pool", "vllm", "--k8s-namespace", "llm",
            "--kubeconfig", str(kubeconfig)]


@pytest.fixture(scope="module", params=["static", "envoy-admin", "kubernetes", "inference-pool"])
def world(request: pytest.FixtureRequest, engines: tuple[FleetProc, EnvoyProc, int, Path]) -> Iterator[World]:
    fleet, envoy, sidecar_port, log_dir = engines
    feeds = ",".join(f"{format_hostport(e['ip'], e['port'])}=[::1]:{e['kv_events_port']}/{e['kv_events_replay_port']}"
                     for e in fleet.engines)
    admin = f"[::1]:{free_port('::1')}"
    with contextlib.ExitStack() as stack:
        args = ["--listen", f"[::1]:{sidecar_port}", "--metrics-listen", f"[::1]:{free_port('::1')}",
                "--admin-listen", admin, "--admin-http-listen", f"[::1]:{free_port('::1')}",
                *discovery_args(request.param, fleet, envoy, stack, log_dir), "--tokenizer", str(TINY_TOKENIZER),
                "--policy", "loadaware", "--prefix-source", "kv-events", "--kv-events-endpoints", feeds,
                "--scrape-interval-s", "0.2", "--scrape-stale-s", "2", "--models-refresh-s", "1"]
        sidecar = stack.enter_context(SidecarProc(args, log_dir=log_dir))
        router = RouterClient(admin)
        stack.callback(router.close)
        world = World(fleet, envoy, sidecar, router, {e["name"]: format_hostport(e["ip"], e["port"])
                                                      for e in fleet.engines})
        router.wait_routable(fleet.endpoints)
        try:
            yield world
        finally:
            for name in world.by_name:
                world.phantom(name, 0)


def test_every_component_names_the_engines_in_brackets(world: World) -> None:
    assert set(world.by_name.values()) == world.router.routable()
    assert {h["address"] for h in world.envoy.cluster_hosts("engines")["engines"]} == set(world.by_name.values())
    state = world.state()
    assert {e["endpoint"] for e in state["endpoints"]} == set(world.by_name.values())


def test_scrapes_and_model_lists_reach_the_sidecar_over_ipv6(world: World) -> None:
    world.phantom("engine-1", 7)

    def seen() -> bool:
        rows = {e["endpoint"]: e for e in world.state()["endpoints"]}
        row = rows[world.by_name["engine-1"]]
        return bool(row["scraped"]) and row["scraped"]["running"] == 7 and bool(row["models"])

    wait_until(seen, message=lambda: f"a scrape and a model list over IPv6: {world.state()['endpoints']}")
    row = {e["endpoint"]: e for e in world.state()["endpoints"]}[world.by_name["engine-1"]]
    assert row["models"]["models"] == ["tiny-model"]
    world.phantom("engine-1", 0)


def test_envoy_honours_the_sidecars_ipv6_destination(world: World) -> None:
    # Two engines look busy (their scrapes say so): the sidecar picks the third, and only override_host
    # following its `[::1]:port` header can put every request there (Envoy's own fallback cannot see the
    # phantom load).
    world.phantom("engine-0", 6)
    world.phantom("engine-2", 6)
    wait_until(lambda: all(e["scraped"] and e["scraped"]["running"] == (0 if e["endpoint"] == world.by_name["engine-1"]
                                                                       else 6) for e in world.state()["endpoints"]),
               message="the sidecar to scrape the phantom loads")
    chosen = world.by_name["engine-1"]
    for i in range(8):
        request_id = f"ipv6-{world.sidecar.listen}-{i}"
        served_by = world.complete(f"question {i} about {WORDS[i % len(WORDS)]}", request_id)
        decision = world.decision(request_id)
        assert decision["endpoint"] == chosen, decision
        assert world.by_name[served_by] == chosen, (served_by, decision)
        assert decision["served"] == chosen and decision["status"] == 200, decision  # Envoy's report, same spelling
    world.phantom("engine-0", 0)
    world.phantom("engine-2", 0)


def test_kv_events_over_ipv6_credit_the_engine_that_served(world: World) -> None:
    prompt = " ".join(WORDS[(i * 5) % len(WORDS)] for i in range(300)) + f" {world.sidecar.listen}"
    holder = world.by_name[world.complete(prompt, f"kv-{world.sidecar.listen}-warm")]
    rounds = itertools.count()

    def credited_again() -> dict[str, Any] | None:
        """The same prompt once more; its decision when the holder was credited with its blocks."""
        request_id = f"kv-{world.sidecar.listen}-{next(rounds)}"
        world.complete(prompt, request_id)
        decision = world.decision(request_id)
        matched = {c["endpoint"]: c["matched_tokens"] for c in decision["candidates"]}
        return decision if matched.get(holder, 0) > 0 else None

    decision = wait_until(credited_again, message="the served engine's KV events to credit it with the prompt")
    assert decision["endpoint"] == holder


def test_envoy_override_host_matches_only_the_bracketed_spelling(
        engines: tuple[FleetProc, EnvoyProc, int, Path], tmp_path: Path) -> None:
    """What the real Envoy expects in the destination header for an IPv6 host: `[::1]:port` (as Envoy itself
    writes the address) picks that host; `::1:port` matches no host and falls back to least_request. Checked on
    a copy of the shipped config without ext_proc and without the filter that drops a client's header, so the
    header reaches override_host as sent."""
    fleet = engines[0]
    write_assignment(tmp_path, [(ep, "HEALTHY") for ep in fleet.endpoints], 1)
    path = eds_config(tmp_path, listen_port=free_port(), admin_port=free_port(), sidecar_port=free_port())
    config = yaml.safe_load(path.read_text())
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] not in (
        "envoy.filters.http.ext_proc", "envoy.filters.http.header_mutation")]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    names = {format_hostport(e["ip"], e["port"]): e["name"] for e in fleet.engines}
    with EnvoyProc(path, tmp_path) as envoy:
        def served_by(header: str) -> str:
            req = urllib.request.Request(envoy.url + "/v1/completions", method="POST",
                                         data=json.dumps({"model": "tiny-model", "prompt": "hi",
                                                          "max_tokens": 1}).encode(),
                                         headers={"content-type": "application/json",
                                                  "x-gateway-destination-endpoint": header})
            with urllib.request.urlopen(req, timeout=20) as resp:
                return str(resp.headers["x-served-by"])

        for endpoint, name in names.items():
            assert {served_by(endpoint) for _ in range(4)} == {name}, endpoint
        target = fleet.endpoints[0]
        unbracketed = target.replace("[", "").replace("]", "")  # ::1:port, the spelling the old parser produced
        # 12 picks by the fallback, each engine ~1/3: all on the named one by chance is about 3^-11
        assert len({served_by(unbracketed) for _ in range(12)}) > 1


@requires_lmcache()
def test_lmcache_credit_reaches_an_ipv6_engine_mapped_by_its_ip(tmp_path: Path) -> None:
    """The real LMCache controller lists a worker at ip `::1`; the sidecar maps it to the endpoint
    `[::1]:port` by that ip (no instance map given) and credits the engine with the prompts it cached."""
    admin = f"[::1]:{free_port('::1')}"
    with LMCacheControllerProc(tmp_path) as lmcache, \
            FleetProc(tmp_path, engines=1, base_ip="::1", port=0, lmcache=lmcache) as fleet:
        (endpoint,) = fleet.endpoints
        args = ["--listen", f"[::1]:{free_port('::1')}", "--metrics-listen", "off", "--admin-listen", admin,
                "--admin-http-listen", "off", "--endpoints", endpoint, "--lmcache-url", lmcache.url,
                "--tokenizer", str(TINY_TOKENIZER), "--models-refresh-s", "0"]
        with SidecarProc(args, log_dir=tmp_path):
            router = RouterClient(admin)
            try:
                wait_until(lambda: {e.endpoint: e.lmcache_instance_id for e in router.endpoints().endpoints}
                           == {endpoint: "engine-0"}, message="the IPv6 worker mapped to its endpoint by ip")
                prompt = " ".join(WORDS[(i * 3) % len(WORDS)] for i in range(400))
                req = urllib.request.Request(http_url(endpoint, "/v1/completions"), method="POST",
                                             data=json.dumps({"model": "tiny-model", "prompt": prompt,
                                                              "max_tokens": 1}).encode(),
                                             headers={"content-type": "application/json"})
                urllib.request.urlopen(req, timeout=20).read()
                body = struct_pb2.Struct()
                body.update({"model": "tiny-model", "prompt": prompt})

                def matched() -> int:
                    reply = router.stub.Explain(pb.ExplainRequest(body=body), timeout=5)
                    return {e.endpoint: e.matched_tokens for e in reply.endpoints}.get(endpoint, 0)

                assert wait_until(matched, message="LMCache's credit for the IPv6 engine") > 0
            finally:
                router.close()
