"""The operator's view through the real grpcurl binary, by server reflection alone, against the real stack
(Envoy, the sidecar, simulated engines, the real LMCache controller): list services, Explain a warm prefix,
watch ListEndpoints follow a scraped load change, health SERVING / NOT_SERVING.

All of it on the admin listener (--admin-listen, loopback): the ext_proc port that the gateway reaches serves
ext_proc and health only, and refuses the debug API and reflection (a prompt sent to Explain would tell whether
someone else recently sent it)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sim.tokenization import SimTokenizer
from testkit.ports import free_port
from testkit.require import requires_lmcache
from testkit.sidecar import SidecarProc
from tests.conftest import wait_until
from tests.prompt_leaks import assert_no_prompt

from .discovery_helpers import FreeStack
from .grpcurl_cli import Grpcurl

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "sim" / "assets" / "tiny-model"
WORDS = [
    "gateway", "cluster", "prefix", "engine", "cache", "token", "batch", "decode", "prefill", "latency", "route",
    "policy", "score", "load", "fleet", "window", "answer", "context", "question", "document",
]

pytestmark = [pytest.mark.e2e, requires_lmcache()]


def text(seed: int, words: int = 700) -> str:
    return " ".join(WORDS[(seed * 5 + i * (seed + 2)) % len(WORDS)] for i in range(words)) + f" case{seed}."


def post_json(url: str, body: Any) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        return resp.status, dict(resp.headers), resp.read()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreeStack]:
    log_dir = tmp_path_factory.mktemp("e2e-grpcurl")
    with FreeStack(log_dir, engines=3, lmcache=True,
                   sidecar_args=["--scrape-interval-s", "0.2", "--scrape-stale-s", "2", "--policy", "loadaware"]) as s:
        yield s


@pytest.fixture(scope="module")
def grpcurl(stack: FreeStack) -> Grpcurl:
    assert stack.sidecar is not None and stack.sidecar.admin_listen.startswith("127.0.0.1:")
    return Grpcurl(stack.sidecar.admin_listen)


def test_reflection_lists_every_service_without_proto_files(grpcurl: Grpcurl) -> None:
    # the admin port lists what it serves: the debug API, health, reflection; ext_proc is not served there
    assert grpcurl.services() == ["grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                                  "loadaware.v1.Router"]
    methods = grpcurl.run("list", "loadaware.v1.Router")
    assert methods.stdout.split() == ["loadaware.v1.Router.Explain", "loadaware.v1.Router.GetConfig",
                                      "loadaware.v1.Router.ListEndpoints"]
    described = grpcurl.run("describe", "loadaware.v1.EndpointScore")
    assert described.returncode == 0 and "relative_load" in described.stdout


def test_the_ext_proc_port_refuses_the_debug_api_and_reflection(stack: FreeStack, grpcurl: Grpcurl) -> None:
    assert stack.sidecar is not None
    extproc = Grpcurl(stack.sidecar.listen)
    listed = extproc.run("list")
    assert listed.returncode != 0 and "does not support the reflection API" in listed.stderr, listed
    for method in ("loadaware.v1.Router/Explain", "loadaware.v1.Router/ListEndpoints",
                   "loadaware.v1.Router/GetConfig"):
        # grpcurl cannot even resolve the method without reflection ...
        refused = extproc.run(method, data={"body": {"prompt": "hello"}})
        assert refused.returncode != 0 and "loadaware.v1.Router" in refused.stderr, refused
        # ... and the server itself does not serve it, whatever the client knows
        with grpc.insecure_channel(stack.sidecar.listen) as channel:
            with pytest.raises(grpc.RpcError) as error:
                channel.unary_unary(f"/{method}")(b"", timeout=5)
            assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with grpc.insecure_channel(stack.sidecar.listen) as channel:
        for name in ("grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection"):
            with pytest.raises(grpc.RpcError) as error:
                next(channel.stream_stream(f"/{name}/ServerReflectionInfo")(iter([b""]), timeout=5))
            assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # health stays on the ext_proc port (probes, the gateway's own health checks), with the same answers
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "readiness", "liveness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            assert grpcurl.health(service) == "SERVING"
    # the routed traffic itself goes through the ext_proc port (Envoy's sidecar cluster)
    status, headers, _ = post_json(stack.url + "/v1/completions", {"model": "tiny-model", "prompt": "hi",
                                                                   "max_tokens": 1})
    assert status == 200 and headers["x-served-by"]


def test_debug_pages_are_on_the_admin_http_port_not_the_metrics_port(stack: FreeStack) -> None:
    assert stack.sidecar is not None
    metrics = f"http://{stack.sidecar.metrics_listen}"
    with urllib.request.urlopen(metrics + "/metrics", timeout=5) as resp:
        assert resp.status == 200 and b"loadaware_decisions_total" in resp.read()
    for path in ("/debug/decisions", "/debug/state"):
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(metrics + path, timeout=5)
        assert missing.value.code == 404
        assert stack.sidecar.debug_json(path) is not None  # on --admin-http-listen
    assert stack.sidecar.debug_url.startswith("http://127.0.0.1:")


def test_explain_on_a_warm_prefix_shows_the_holder_and_the_formula(stack: FreeStack, grpcurl: Grpcurl) -> None:
    assert stack.fleet is not None and stack.sidecar is not None
    endpoint_of = {e["name"]: f"{e['ip']}:{e['port']}" for e in stack.fleet.engines}
    prompt = text(11)
    status, headers, _ = post_json(stack.url + "/v1/completions",
                                   {"model": "tiny-model", "prompt": prompt, "max_tokens": 2})
    assert status == 200
    holder = endpoint_of[headers["x-served-by"]]
    request = {"path": "/v1/completions", "body": {"model": "tiny-model", "prompt": prompt, "max_tokens": 2}}

    def explained() -> dict[str, Any] | None:
        reply = grpcurl.call("loadaware.v1.Router/Explain", request)
        rows = {e["endpoint"]: e for e in reply["endpoints"]}
        # credited, and no scrape still shows the warming request running (even loads)
        return reply if rows[holder]["matched_tokens"] > 0 and all(r["load"] == 0 for r in rows.values()) else None

    decisions_before = stack.sidecar.metrics_text().count("loadaware_decisions_total{")
    reply = wait_until(explained, message="LMCache to credit the holder")
    rows = {e["endpoint"]: e for e in reply["endpoints"]}
    n = reply["prompt_tokens"]
    assert reply["outcome"] == "routed" and reply["policy"] == "loadaware" and reply["beta"] == 1
    # LMCache credits every full 256-token chunk of the prompt; the sidecar's record beside it (the default with
    # --lmcache-url and a tokenizer) every full 16-token block it sent there: the best of the two
    assert rows[holder]["matched_tokens"] == max((n // 256) * 256, (n // 16) * 16)
    assert rows[holder]["lmcache_instance_id"] == headers["x-served-by"]
    assert all(r["matched_tokens"] == 0 for ep, r in rows.items() if ep != holder)
    mean = reply["mean_load"]
    for row in rows.values():
        assert row["benefit"] == pytest.approx(min(1.0, row["matched_tokens"] / n))
        assert row["relative_load"] == pytest.approx((row["load"] - mean) / max(1.0, mean))
        assert row["score"] == pytest.approx(row["benefit"] - 1.0 * row["relative_load"])
    assert reply["endpoint"] == holder and rows[holder]["chosen"]  # even loads: the prefix wins
    # Explain is not a routed request: no decision counted, nothing in flight
    assert stack.sidecar.metrics_text().count("loadaware_decisions_total{") == decisions_before
    assert all(r["inflight"] == 0 for r in rows.values())


def test_list_endpoints_reflects_a_scraped_load_change(stack: FreeStack, grpcurl: Grpcurl) -> None:
    assert stack.fleet is not None
    engine = stack.fleet.engines[1]
    endpoint = f"{engine['ip']}:{engine['port']}"
    try:
        post_json(f"http://{endpoint}/sim/phantom_load", {"running": 7, "waiting": 3})

        def loaded() -> dict[str, Any] | None:
            rows = {e["endpoint"]: e for e in grpcurl.call("loadaware.v1.Router/ListEndpoints")["endpoints"]}
            row = rows[endpoint]
            scrape = row["last_scrape"]
            # a fresh scrape: a stale one (older than --scrape-stale-s) still shows its numbers but is ignored
            return row if scrape["running"] == 7 and scrape["waiting"] == 3 and scrape["fresh"] else None

        row = wait_until(loaded, message="the scrape to see the phantom load")
        assert row["load"] >= 10 and row["last_scrape"]["fresh"] and row["last_scrape"]["age_seconds"] < 2
        assert row["routable"] and row["health"] == "HEALTHY" and row["source"] == "static"
        assert row["lmcache_instance_id"] == engine["name"]
        # and the decision follows it: Explain now scores that engine down
        reply = grpcurl.call("loadaware.v1.Router/Explain", {"body": {"prompt": text(12, 50)}})
        scores = {e["endpoint"]: e for e in reply["endpoints"]}
        assert scores[endpoint]["relative_load"] > 0 and reply["endpoint"] != endpoint
    finally:
        post_json(f"http://{endpoint}/sim/phantom_load", {"running": 0, "waiting": 0})
    wait_until(lambda: {e["endpoint"]: e for e in grpcurl.call("loadaware.v1.Router/ListEndpoints")["endpoints"]}
               [endpoint]["last_scrape"]["running"] == 0, message="the load to clear")


def test_a_served_prompt_is_never_shown_by_explain_or_the_debug_pages(stack: FreeStack, grpcurl: Grpcurl) -> None:
    """Through real Envoy and the real LMCache controller: Explain may say that a prompt was served and where
    (the reason it is only on the admin port), never what it said; neither may /debug/decisions, /debug/state."""
    assert stack.sidecar is not None and stack.fleet is not None
    secret = "Ottoline-9317 hid the saffron ledger under the lighthouse"
    words = ("ottoline", "9317", "saffron", "ledger", "lighthouse")
    prompt = " ".join(f"{secret}, entry {i}." for i in range(60))
    token_ids = SimTokenizer(TOKENIZER).encode_prompt(prompt)
    status, headers, _ = post_json(stack.url + "/v1/completions",
                                   {"model": "tiny-model", "prompt": prompt, "max_tokens": 2})
    assert status == 200
    holder = {e["name"]: f"{e['ip']}:{e['port']}" for e in stack.fleet.engines}[headers["x-served-by"]]
    request = {"body": {"model": "tiny-model", "prompt": prompt, "max_tokens": 2}}

    def credited() -> dict[str, Any] | None:
        reply = grpcurl.call("loadaware.v1.Router/Explain", request)
        return reply if {e["endpoint"]: e for e in reply["endpoints"]}[holder]["matched_tokens"] > 0 else None

    replies = [wait_until(credited, message="LMCache to credit the engine that served the prompt"),
               grpcurl.call("loadaware.v1.Router/Explain", {"raw_body": json.dumps({"prompt": token_ids})}),
               grpcurl.call("loadaware.v1.Router/Explain", {"raw_body": "{" + prompt})]
    assert replies[2]["outcome"] == "rejected"
    for i, reply in enumerate(replies):
        assert_no_prompt(f"Explain reply {i}", reply, json.dumps(reply), words, token_ids)
    decisions = stack.sidecar.debug_json("/debug/decisions?n=256")
    assert any(d["prompt_tokens"] == len(token_ids) for d in decisions)  # the routed request is recorded
    assert_no_prompt("/debug/decisions", decisions, json.dumps(decisions), words, token_ids)
    state = stack.sidecar.debug_json("/debug/state")
    assert_no_prompt("/debug/state", state, json.dumps(state), words, token_ids)


def test_get_config_shows_origins(grpcurl: Grpcurl) -> None:
    rows = {s["name"]: s for s in grpcurl.call("loadaware.v1.Router/GetConfig")["settings"]}
    assert rows["scrape_interval_s"] == {"name": "scrape_interval_s", "flag": "--scrape-interval-s",
                                         "env": "LOADAWARE_SCRAPE_INTERVAL_S", "value": 0.2, "origin": "flag"}
    assert rows["policy"]["origin"] == "flag" and rows["policy"]["value"] == "loadaware"
    assert rows["discovery"]["origin"] == "default"
    assert rows["discovery"]["value"] == "static"
    # the prefix sources the default chose, and why: LMCache with the sidecar's record beside it
    assert rows["prefix_source"]["origin"] == "default"
    assert rows["prefix_source"]["value"].startswith("lmcache,approx (default: LMCache credits one holder")


def test_health_serving_and_not_serving(stack: FreeStack, grpcurl: Grpcurl, tmp_path: Path) -> None:
    assert stack.fleet is not None
    assert grpcurl.health("") == "SERVING"
    assert grpcurl.health("envoy.service.ext_proc.v3.ExternalProcessor") == "SERVING"
    assert grpcurl.health("liveness") == "SERVING"
    unknown = grpcurl.run("grpc.health.v1.Health/Check", data={"service": "nope"})
    assert unknown.returncode != 0 and "NotFound" in unknown.stderr
    # A second sidecar whose endpoints file is empty: alive, but not ready until a fleet is in and scraped.
    endpoints_file = tmp_path / "endpoints.txt"
    endpoints_file.write_text("# no engines yet\n")
    listen = f"127.0.0.1:{free_port()}"
    with ListeningSidecar(["--listen", listen, "--metrics-listen", "off", "--endpoints-file", str(endpoints_file),
                           "--scrape-interval-s", "0.2", "--scrape-stale-s", "2"], log_dir=tmp_path) as sidecar:
        second = Grpcurl(sidecar.admin_listen)
        assert second.health("") == "NOT_SERVING"
        assert second.health("liveness") == "SERVING"  # a liveness probe must not restart it for this
        listed = second.call("loadaware.v1.Router/ListEndpoints")
        assert listed["endpoints"] == [] and listed["ready"] is False and listed["discovery"] == "file"
        endpoints_file.write_text("\n".join(stack.fleet.endpoints) + "\n")
        wait_until(lambda: second.health("") == "SERVING", message="SERVING once the fleet is in and scraped")
        assert second.call("loadaware.v1.Router/ListEndpoints")["ready"] is True
        endpoints_file.write_text("")
        wait_until(lambda: second.health("") == "NOT_SERVING", message="NOT_SERVING with the fleet gone")
        assert second.health("liveness") == "SERVING"


class ListeningSidecar(SidecarProc):
    """Started once its gRPC ports accept: these tests look at it while it is (meant to be) not ready."""

    def _is_ready(self) -> bool:
        for address in (self.listen, self.admin_listen):
            host, _, port = address.rpartition(":")
            with socket.socket() as s:
                s.settimeout(0.2)
                if s.connect_ex((host, int(port))) != 0:
                    return False
        return True
