"""The operator's view through the real grpcurl binary, by server reflection alone, against the real stack
(Envoy, the sidecar, simulated engines, the real LMCache controller): list services, Explain a warm prefix,
watch ListEndpoints follow a scraped load change, health SERVING / NOT_SERVING."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.lmcache import LMCacheControllerProc
from testkit.ports import free_port
from testkit.sidecar import SidecarProc
from tests.conftest import wait_until

from .discovery_helpers import FreeStack
from .grpcurl_cli import Grpcurl

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "sim" / "assets" / "tiny-model"
WORDS = [
    "gateway", "cluster", "prefix", "engine", "cache", "token", "batch", "decode", "prefill", "latency", "route",
    "policy", "score", "load", "fleet", "window", "answer", "context", "question", "document",
]

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not LMCacheControllerProc.available(),
                                                  reason="LMCache venv missing: run `make lmcache`")]


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
                   sidecar_args=["--scrape-interval-s", "0.2", "--scrape-stale-s", "2"]) as s:
        yield s


@pytest.fixture(scope="module")
def grpcurl(stack: FreeStack) -> Grpcurl:
    assert stack.sidecar is not None
    return Grpcurl(stack.sidecar.listen)


def test_reflection_lists_every_service_without_proto_files(grpcurl: Grpcurl) -> None:
    assert grpcurl.services() == ["envoy.service.ext_proc.v3.ExternalProcessor", "grpc.health.v1.Health",
                                  "grpc.reflection.v1alpha.ServerReflection", "loadaware.v1.Router"]
    methods = grpcurl.run("list", "loadaware.v1.Router")
    assert methods.stdout.split() == ["loadaware.v1.Router.Explain", "loadaware.v1.Router.GetConfig",
                                      "loadaware.v1.Router.ListEndpoints"]
    described = grpcurl.run("describe", "loadaware.v1.EndpointScore")
    assert described.returncode == 0 and "relative_load" in described.stdout


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
    assert rows[holder]["matched_tokens"] == (n // 256) * 256  # every full 256-token chunk of the prompt
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


def test_get_config_shows_origins(grpcurl: Grpcurl) -> None:
    rows = {s["name"]: s for s in grpcurl.call("loadaware.v1.Router/GetConfig")["settings"]}
    assert rows["scrape_interval_s"] == {"name": "scrape_interval_s", "flag": "--scrape-interval-s",
                                         "env": "LOADAWARE_SCRAPE_INTERVAL_S", "value": 0.2, "origin": "flag"}
    assert rows["policy"]["origin"] == "default" and rows["policy"]["value"] == "loadaware"
    assert rows["discovery"]["value"] == "static"


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
                           "--scrape-interval-s", "0.2", "--scrape-stale-s", "2"], log_dir=tmp_path):
        second = Grpcurl(listen)
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
    """Started once its gRPC port accepts: these tests look at it while it is (meant to be) not ready."""

    def _is_ready(self) -> bool:
        host, _, port = self.listen.rpartition(":")
        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex((host, int(port))) == 0
