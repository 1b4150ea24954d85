"""End to end: the sidecar as an InferencePool's Endpoint Picker, behind the real Envoy running
envoy/envoy-inference-pool.yaml (ext_proc FULL_DUPLEX_STREAMED, `envoy.lb` metadata both ways, override_host
walking the picked list, fail closed), with the real sidecar process and three simulated engines.

Every process runs on free loopback addresses (the config is copied under the test's directory with its
addresses rewritten and every other setting as shipped), so these tests never queue on the loopback lock.
What a test adds to its copy says why: a host nothing listens on, `set_metadata` routes that write the
proxy's subset hint (Envoy sets `envoy.lb.subset_hint` only if a filter does), `failure_mode_allow: true`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import re
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from testkit.envoy import EnvoyProc
from testkit.fleet import FleetProc
from testkit.paths import REPO, TINY_TOKENIZER
from testkit.ports import accepts, free_port
from testkit.sidecar import SidecarProc
from tests.conftest import wait_until, wait_until_async
from tests.e2e.discovery_helpers import free_fleet_address

pytestmark = pytest.mark.e2e

PICKER_CONFIG = REPO / "envoy" / "envoy-inference-pool.yaml"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SUBSET_HEADER = "x-test-subset"  # routes of the test's config copy that set the subset hint
OUTSIDE_FLEET = "10.255.255.1:8000"  # an address in no subset the sidecar could route to
HCM_STAT = "http.inference_pool_http"  # the listener's stat_prefix in the shipped config
DECODE_MS = "10"  # per generated token: long streams stay open while the test looks, short ones end quickly
LONG_STREAM_TOKENS = 3000  # ~30 s of generation: never ends by itself while a test holds it
FALLBACK_ENDPOINTS = 2  # the sidecar's default --fallback-endpoints: the choice + 2 next-best


# ---------------------------------------------------------------------------------------------------------
# the config copy
# ---------------------------------------------------------------------------------------------------------

def _socket(endpoint: str) -> dict[str, Any]:
    host, _, port = endpoint.rpartition(":")
    return {"address": {"socket_address": {"address": host, "port_value": int(port)}}}


def picker_config(path: Path, *, listen_port: int, admin_port: int, sidecar_port: int, engines: list[str],
                  subsets: dict[str, list[str]] | None = None, failure_mode_allow: bool | None = None) -> Path:
    """envoy-inference-pool.yaml with its addresses rewritten, written to `path`.

    `engines`: the engines cluster's hosts, in order. `subsets`: for each value of the header
    x-test-subset, a route (ahead of the shipped one, the same in every other respect) whose
    `envoy.filters.http.set_metadata` filter writes that list as the subset hint; ext_proc then also forwards
    the `envoy.lb.subset_hint` namespace. `failure_mode_allow`: override the shipped value."""
    config: dict[str, Any] = yaml.safe_load(PICKER_CONFIG.read_text())
    config["admin"]["address"]["socket_address"]["port_value"] = admin_port
    listener = config["static_resources"]["listeners"][0]
    listener["address"]["socket_address"]["port_value"] = listen_port
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == "engines":
            cluster["load_assignment"]["endpoints"] = [
                {"lb_endpoints": [{"endpoint": _socket(ep)} for ep in engines]}]
        elif cluster["name"] == "loadaware":
            cluster["load_assignment"]["endpoints"] = [
                {"lb_endpoints": [{"endpoint": _socket(f"127.0.0.1:{sidecar_port}")}]}]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    filters: list[dict[str, Any]] = hcm["http_filters"]
    at = [f["name"] for f in filters].index("envoy.filters.http.ext_proc")
    ext_proc = filters[at]["typed_config"]
    if failure_mode_allow is not None:
        ext_proc["failure_mode_allow"] = failure_mode_allow
    if subsets:
        ext_proc["metadata_options"]["forwarding_namespaces"]["untyped"].append(SUBSET_NAMESPACE)
        vhost = hcm["route_config"]["virtual_hosts"][0]
        (shipped,) = vhost["routes"]
        routes = []
        for i, (value, subset) in enumerate(subsets.items()):
            name = f"test.subset_hint.{i}"
            # Off in the chain; on for its own route only (a FilterConfig without a config enables it).
            filters.insert(at + i, {"name": name, "disabled": True, "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
                "metadata": [{"metadata_namespace": SUBSET_NAMESPACE, "value": {SUBSET_KEY: list(subset)}}]}})
            route = copy.deepcopy(shipped)
            route["match"] = {"prefix": "/", "headers": [{"name": SUBSET_HEADER, "string_match": {"exact": value}}]}
            route["typed_per_filter_config"] = {
                name: {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}}
            routes.append(route)
        vhost["routes"] = [*routes, shipped]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# ---------------------------------------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------------------------------------

@dataclass
class Fleet:
    proc: FleetProc

    @property
    def endpoints(self) -> list[str]:
        return self.proc.endpoints

    @property
    def by_name(self) -> dict[str, str]:
        return {e["name"]: f"{e['ip']}:{e['port']}" for e in self.proc.engines}

    def state(self, endpoint: str) -> dict[str, Any]:
        return get_json(f"http://{endpoint}/sim/state")

    def requests_seen(self) -> dict[str, int]:
        """Per engine: requests that reached it (completed, aborted or failed) and prompt tokens it read."""
        out = {}
        for ep in self.endpoints:
            st = self.state(ep)
            out[ep] = st["served"] + st["aborted"] + st["failed"] + st["prompt_tokens_total"]
        return out

    def phantom(self, loads: dict[str, int]) -> None:
        for ep, running in loads.items():
            req = urllib.request.Request(f"http://{ep}/sim/phantom_load", method="POST",
                                         data=json.dumps({"running": running}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=5) as resp:
                assert resp.status == 200


class Picker:
    """One sidecar process (`loadaware-sidecar serve`) on free ports, and what its debug port says."""

    def __init__(self, log_dir: Path, endpoints: list[str], name: str = "sidecar", extra: tuple[str, ...] = ()
                 ) -> None:
        self.port = free_port()
        self.metrics = f"127.0.0.1:{free_port()}"
        self.proc = SidecarProc(
            ["--listen", f"127.0.0.1:{self.port}", "--metrics-listen", self.metrics,
             "--endpoints", ",".join(endpoints), "--policy", "loadaware", "--tokenizer", str(TINY_TOKENIZER),
             "--prefix-source", "approx", "--scrape-interval-s", "0.2", "--scrape-stale-s", "2", *extra],
            log_dir=log_dir / name)

    @property
    def debug_url(self) -> str:
        return self.proc.debug_url  # the admin HTTP listener (testkit's SidecarProc gives it a free port)

    def state(self) -> dict[str, Any]:
        return get_json(f"{self.debug_url}/debug/state")

    def decisions(self, n: int = 50) -> list[dict[str, Any]]:
        return list(get_json(f"{self.debug_url}/debug/decisions?n={n}"))

    def decision(self, request_id: str) -> dict[str, Any]:
        """The decision of the request sent with this x-request-id (Envoy keeps a loopback client's)."""
        def find() -> dict[str, Any] | None:
            return next((d for d in self.decisions() if d["request_id"] == request_id), None)

        return wait_until(find, message=f"the decision for request {request_id}")

    def scraped_running(self) -> dict[str, int | None]:
        return {row["endpoint"]: None if row["scraped"] is None else row["scraped"]["running"]
                for row in self.state()["endpoints"]}

    def wait_scraped(self, running: dict[str, int]) -> None:
        """Until the sidecar's scrape shows these engines' running counts (phantom load included)."""
        wait_until(lambda: all(self.scraped_running().get(ep) == n for ep, n in running.items()),
                   message=lambda: f"the sidecar to scrape running={running} (it has {self.scraped_running()})")

    def drained(self) -> dict[str, Any] | None:
        state = self.state()
        return state if state["inflight_total"] == 0 and state["open_streams"] == 0 else None

    async def wait_drained(self) -> dict[str, Any]:
        """Until no request is counted in flight and no ext_proc stream is open. Async: a client closing its
        connection needs the event loop to run for the close to happen at all."""
        return await wait_until_async(
            self.drained, message=lambda: f"in-flight counts and open streams back to 0: {self.state()}")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def start_envoy(log_dir: Path, name: str, sidecar_port: int, engines: list[str], **options: Any) -> EnvoyProc:
    config = picker_config(log_dir / f"{name}.yaml", listen_port=free_port(), admin_port=free_port(),
                           sidecar_port=sidecar_port, engines=engines, **options)
    return EnvoyProc(config, log_dir / name).start()


def counter(envoy: EnvoyProc, name: str) -> int:
    return int(envoy.stats().get(name, 0))


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-endpoint-picker")


@pytest.fixture(scope="module")
def fleet(log_dir: Path) -> Iterator[Fleet]:
    base_ip, port = free_fleet_address(3)
    with FleetProc(log_dir / "fleet", engines=3, base_ip=base_ip, port=port,
                   extra_args=["--decode-base-ms", DECODE_MS]) as proc:
        yield Fleet(proc)


@pytest.fixture(autouse=True)
def _no_phantom_load(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that puts phantom load on the engines leaves them unloaded for the next one."""
    yield
    if "fleet" in request.fixturenames:
        fleet: Fleet = request.getfixturevalue("fleet")
        fleet.phantom(dict.fromkeys(fleet.endpoints, 0))


@pytest.fixture(scope="module")
def picker(log_dir: Path, fleet: Fleet) -> Iterator[Picker]:
    p = Picker(log_dir, fleet.endpoints)
    with p.proc:
        yield p


def subset_of_one(fleet: Fleet) -> str:
    """The engine the gateway's `x-test-subset: one` route names alone: the one ties never pick (the
    lexically smallest wins a tie), so only the subset can send traffic there."""
    return max(fleet.endpoints)


@pytest.fixture(scope="module")
def gateway(log_dir: Path, fleet: Fleet, picker: Picker) -> Iterator[EnvoyProc]:
    one = subset_of_one(fleet)
    with start_envoy(log_dir, "envoy-picker", picker.port, fleet.endpoints,
                     subsets={"one": [one], "none": [OUTSIDE_FLEET]}) as envoy:
        yield envoy


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


# ---------------------------------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------------------------------

_counter = iter(range(1_000_000))


def unique(tag: str) -> str:
    """A prompt no other request used: the approximate prefix index has no credit for it anywhere."""
    return f"{tag} request {next(_counter)} about the gateway and its endpoint picker"


def request_body(kind: str, stream: bool, text: str, max_tokens: int = 12, padding: int = 0) -> bytes:
    """A body as a client might write it, not as json.dumps would: odd spacing, key order, non-ASCII and
    escapes; the engine must receive exactly these bytes. `padding` adds a field of that many bytes that
    only the engine ignores, so the body spans several ext_proc chunks and re-emitted pieces."""
    if kind == "chat":
        head = ('{ "messages" : [ {"role":"system","content":"Réponds briévement \\u00e9 \\"ok\\""},\n'
                f'   {{"role": "user", "content": "{text}"}} ],\n "model":"tiny-model"')
        tail = f',"max_completion_tokens":  {max_tokens}'
    else:
        head = f'{{"prompt":"{text} — ünïcödé \\t tab",\n\t"model" : "tiny-model"'
        tail = f', "max_tokens":{max_tokens}'
    pad = f',\n  "user": "{"x" * padding}"' if padding else ""
    return f'{head}{tail}, "stream": {"true" if stream else "false"}{pad}  }}\n'.encode()


def path_of(kind: str) -> str:
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


async def pieces(body: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i:i + size]
        await asyncio.sleep(0)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def served_by(self) -> str:
        return self.headers.get("x-served-by", "")


async def send(http: aiohttp.ClientSession, url: str, path: str, body: bytes, *, chunk: int | None = None,
               headers: dict[str, str] | None = None) -> Reply:
    """POST and read the whole answer. `chunk`: upload in pieces of that size (chunked transfer encoding)."""
    data: Any = body if chunk is None else pieces(body, chunk)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    async with http.post(url + path, data=data, headers=hdrs) as resp:
        return Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, await resp.read())


def normalized(body: bytes) -> bytes:
    """The response without what the engine makes up per request (its id and creation second)."""
    body = re.sub(rb'"id": ?"(chatcmpl|cmpl)-[0-9a-f]{32}"', b'"id":"<id>"', body)
    return re.sub(rb'"created": ?\d+', b'"created":0', body)


def request_id(tag: str) -> str:
    return f"test-{tag}-{next(_counter)}"


# ---------------------------------------------------------------------------------------------------------
# 1. completions and chat, streamed and not: the body reaches the engine unchanged, the answer the client
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("kind", ["completions", "chat"])
async def test_requests_pass_through_unchanged(http: aiohttp.ClientSession, gateway: EnvoyProc, picker: Picker,
                                               fleet: Fleet, kind: str, stream: bool) -> None:
    engines = fleet.by_name
    small = request_body(kind, stream, unique(kind))
    # ~200 KB uploaded chunked in 50 KB pieces: it reaches the picker in as many body messages as Envoy reads
    # it in, is held until its end, goes back in 64 KiB streamed mutations and is copied into the router's
    # retry buffer; none of it may change a byte.
    large = request_body(kind, stream, unique(kind), padding=200_000)
    for body, chunk in ((small, None), (large, 50_000)):
        rid = request_id(kind)
        via = await send(http, gateway.url, path_of(kind), body, chunk=chunk, headers={"x-request-id": rid})
        assert via.status == 200, via
        assert via.served_by in engines, via.headers
        served = engines[via.served_by]
        assert via.headers["x-sim-body-sha256"] == hashlib.sha256(body).hexdigest(), \
            f"the engine received other bytes than the client sent ({len(body)} bytes, chunk={chunk})"
        decision = picker.decision(rid)  # it went through the picker, which read the prompt from the held body
        assert decision["outcome"] == "routed" and decision["prompt_tokens"] > 0, decision
        assert decision["served"] == served == decision["ranked"][0], decision

        # The same request straight to the engine that served it, twice: the engine answers the same bytes
        # for the same request but for its id and creation second, so the gateway's answer must be those.
        direct = [await send(http, f"http://{served}", path_of(kind), body) for _ in range(2)]
        assert all(d.status == 200 for d in direct), direct
        assert normalized(direct[0].body) == normalized(direct[1].body), "the simulated engine is not deterministic"
        assert normalized(via.body) == normalized(direct[0].body)
        assert via.body != normalized(via.body), "normalization hid nothing: the comparison above is too weak"
        if stream:
            assert via.headers["content-type"].startswith("text/event-stream"), via.headers
            events = via.body.split(b"\n\n")
            assert events[-2:] == [b"data: [DONE]", b""], via.body[-200:]
            tokens = 12 + (1 if kind == "chat" else 0)  # chat streams open with the role delta
            assert len(events) == tokens + 2 and all(e.startswith(b"data: {") for e in events[:-2]), via.body
            assert len({json.loads(e[6:])["id"] for e in events[:-2]}) == 1  # one response, not a mix
        else:
            answer = json.loads(via.body)
            assert answer["usage"]["completion_tokens"] == 12, answer
            text = answer["choices"][0]["message"]["content"] if kind == "chat" else answer["choices"][0]["text"]
            assert text.strip(), answer


# ---------------------------------------------------------------------------------------------------------
# 2. the ranked list, and the primary serves
# ---------------------------------------------------------------------------------------------------------

async def test_ranked_list_sent_and_primary_serves(http: aiohttp.ClientSession, gateway: EnvoyProc,
                                                   picker: Picker, fleet: Fleet) -> None:
    e0, e1, e2 = sorted(fleet.endpoints)
    # Loads that order the engines against the tie-break (which prefers the lexically smallest): e2 e1 e0.
    loads = {e0: 6, e1: 3, e2: 0}
    fleet.phantom(loads)
    picker.wait_scraped(loads)
    names = {ep: name for name, ep in fleet.by_name.items()}
    before = picker.state()["streams_by_mode"]
    for i in range(6):
        kind = ("completions", "chat")[i % 2]
        rid = request_id("ranked")
        reply = await send(http, gateway.url, path_of(kind), request_body(kind, i >= 3, unique("ranked")),
                           headers={"x-request-id": rid})
        assert reply.status == 200, reply
        decision = picker.decision(rid)
        assert len(decision["ranked"]) == 1 + FALLBACK_ENDPOINTS, decision
        assert decision["ranked"] == [e2, e1, e0], decision  # best first, by score
        assert decision["endpoint"] == decision["served"] == e2, decision
        assert reply.served_by == names[e2], (reply.headers, decision)
    # the gateway's streams were told apart as full duplex from what Envoy announced, none as BUFFERED
    after = picker.state()["streams_by_mode"]
    assert after["full_duplex"] - before["full_duplex"] == 6 and after["buffered"] == before["buffered"]


# ---------------------------------------------------------------------------------------------------------
# 3. an engine that refuses connections: the retry takes the next of the list, the count follows
# ---------------------------------------------------------------------------------------------------------

async def test_refused_engine_skipped_to_next_of_list(http: aiohttp.ClientSession, log_dir: Path,
                                                      fleet: Fleet) -> None:
    dead = f"127.0.0.1:{free_port()}"
    assert not accepts("127.0.0.1", int(dead.rpartition(":")[2]))
    e0, e1, e2 = sorted(fleet.endpoints)
    names = {ep: name for name, ep in fleet.by_name.items()}
    # The dead host is first in the engines cluster and in the sidecar's fleet, and unloaded (its scrape
    # fails: its load is the sidecar's own count, 0); the live engines carry phantom load, e0 the least.
    # Its failing scrapes would take it out of rotation at once (test_failing_engines.py): that is turned off
    # here, so the request goes to it and the proxy's retry has to walk the list.
    picker = Picker(log_dir, [dead, *fleet.endpoints], name="sidecar-dead-host",
                    extra=("--unreachable-after-scrapes", "0"))
    with picker.proc, start_envoy(log_dir, "envoy-dead-host", picker.port, [dead, *fleet.endpoints]) as envoy:
        loads = {e0: 2, e1: 4, e2: 6}
        fleet.phantom(loads)
        picker.wait_scraped(loads)
        refused = counter(envoy, "cluster.engines.upstream_cx_connect_fail")

        rid = request_id("dead")
        reply = await send(http, envoy.url, "/v1/completions", request_body("completions", False, unique("dead")),
                           headers={"x-request-id": rid})
        assert reply.status == 200, reply
        decision = picker.decision(rid)
        assert decision["ranked"] == [dead, e0, e1], decision
        assert decision["endpoint"] == dead and reply.served_by == names[e0], (reply.headers, decision)
        # The served-endpoint report (Envoy's selected_host_key, forwarded with the response) reached it.
        assert decision["served"] == e0, decision
        assert counter(envoy, "cluster.engines.upstream_cx_connect_fail") > refused  # .. after a refusal
        await picker.wait_drained()

        # While a streamed request runs, its in-flight count is on the engine that serves it, not the choice.
        rid = request_id("dead-stream")
        async with http.post(envoy.url + "/v1/chat/completions", headers={"x-request-id": rid},
                             data=request_body("chat", True, unique("dead-stream"), max_tokens=LONG_STREAM_TOKENS)
                             ) as resp:
            assert resp.status == 200 and resp.headers["x-served-by"] == names[e0], resp.headers
            assert (await resp.content.readuntil(b"\n\n")).startswith(b"data: {")
            decision = picker.decision(rid)
            assert decision["endpoint"] == dead and decision["served"] == e0, decision

            def counted() -> dict[str, int]:
                return {ep: n for ep, n in picker.state()["inflight"].items() if n}

            wait_until(lambda: counted() == {e0: 1}, message=lambda: f"the count on {e0} only: {counted()}")
            resp.close()  # the client goes away mid-stream
        await picker.wait_drained()


# ---------------------------------------------------------------------------------------------------------
# 4. the proxy's subset hint: honoured, and 503 when nothing in it is eligible
# ---------------------------------------------------------------------------------------------------------

async def test_subset_hint_honoured(http: aiohttp.ClientSession, gateway: EnvoyProc, picker: Picker,
                                    fleet: Fleet) -> None:
    one = subset_of_one(fleet)
    names = {ep: name for name, ep in fleet.by_name.items()}
    # The subset's engine is the one the picker would rank last on its own.
    loads = dict.fromkeys(fleet.endpoints, 0) | {one: 6}
    fleet.phantom(loads)
    picker.wait_scraped(loads)
    for i in range(6):
        kind = ("completions", "chat")[i % 2]
        rid = request_id("subset")
        reply = await send(http, gateway.url, path_of(kind), request_body(kind, i >= 3, unique("subset")),
                           headers={SUBSET_HEADER: "one", "x-request-id": rid})
        assert reply.status == 200 and reply.served_by == names[one], reply
        decision = picker.decision(rid)
        assert [c["endpoint"] for c in decision["candidates"]] == [one], decision
        assert decision["ranked"] == [one] and decision["served"] == one, decision
    # Control: without the hint the same picker ranks that engine last and another one serves.
    rid = request_id("no-subset")
    reply = await send(http, gateway.url, "/v1/completions", request_body("completions", False, unique("subset")),
                       headers={"x-request-id": rid})
    decision = picker.decision(rid)
    assert reply.status == 200 and reply.served_by != names[one], reply
    assert len(decision["candidates"]) == 3 and decision["ranked"][-1] == one, decision


async def test_ineligible_subset_answered_503(http: aiohttp.ClientSession, gateway: EnvoyProc, picker: Picker,
                                             fleet: Fleet) -> None:
    seen = fleet.requests_seen()
    upstream = counter(gateway, "cluster.engines.upstream_rq_total")
    for kind in ("completions", "chat"):
        rid = request_id("ineligible")
        reply = await send(http, gateway.url, path_of(kind), request_body(kind, False, unique("ineligible")),
                           headers={SUBSET_HEADER: "none", "x-request-id": rid})
        assert reply.status == 503, reply
        assert reply.headers["content-type"] == "application/json", reply.headers
        error = json.loads(reply.body)["error"]
        assert error["code"] == 503 and isinstance(error["type"], str), error
        assert "no endpoint in the proxy's subset is ready" in error["message"], error
        decision = picker.decision(rid)
        assert decision["outcome"] == "no_eligible_endpoints" and decision["ranked"] == [], decision
    # It reached no engine.
    assert counter(gateway, "cluster.engines.upstream_rq_total") == upstream
    assert fleet.requests_seen() == seen


# The picker's own answers through this gateway: (what to send, its status, the picker's message).
LOCAL_REPLIES = {
    "ineligible-subset": ({SUBSET_HEADER: "none"}, b'{"prompt": "hello", "max_tokens": 4}', 503,
                          "no endpoint in the proxy's subset is ready"),
    "not-json": ({}, b"{not json", 400, "request body is not valid JSON"),
    "too-large": ({}, b'{"prompt": "' + b"x" * (8 * 1024 * 1024 + 1) + b'"}', 413, "request body is too large"),
    "too-deep": ({}, b"[" * 200_000 + b"]" * 200_000, 400, "request body nests deeper than 64 levels"),
}


@pytest.mark.parametrize("case", list(LOCAL_REPLIES))
async def test_picker_local_replies_are_json(http: aiohttp.ClientSession, gateway: EnvoyProc, fleet: Fleet,
                                             case: str) -> None:
    headers, body, status, message = LOCAL_REPLIES[case]
    seen = fleet.requests_seen()
    upstream = counter(gateway, "cluster.engines.upstream_rq_total")
    reply = await send(http, gateway.url, "/v1/completions", body, headers=headers)
    assert reply.status == status and reply.headers["content-type"] == "application/json", reply.headers
    error = json.loads(reply.body)["error"]
    # the picker's own JSON, passed through as it is (not wrapped again by Envoy's local-reply formatting)
    assert error["code"] == status and error["message"] == message and error["type"], error
    assert counter(gateway, "cluster.engines.upstream_rq_total") == upstream
    assert fleet.requests_seen() == seen


# ---------------------------------------------------------------------------------------------------------
# 5. gRPC health: the protocol's service names
# ---------------------------------------------------------------------------------------------------------

def test_health_names_serving(picker: Picker) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{picker.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            status = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING, (service, status)
        with pytest.raises(grpc.RpcError) as unknown:  # not a catch-all: an unknown name is NOT_FOUND
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


# ---------------------------------------------------------------------------------------------------------
# 6. client aborts mid-stream: every count back to 0
# ---------------------------------------------------------------------------------------------------------

async def test_counts_back_to_zero_after_client_aborts(gateway: EnvoyProc, picker: Picker, fleet: Fleet) -> None:
    await picker.wait_drained()
    aborted_before = sum(fleet.state(ep)["aborted"] for ep in fleet.endpoints)
    streams = 4
    async with contextlib.AsyncExitStack() as stack:
        responses = []
        for i in range(streams):
            kind = ("completions", "chat")[i % 2]
            # One connection each: closing a response closes its connection, which is the client's abort.
            session = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True), timeout=aiohttp.ClientTimeout(total=60)))
            resp = await stack.enter_async_context(session.post(
                gateway.url + path_of(kind), headers={"Content-Type": "application/json"},
                data=request_body(kind, True, unique("abort"), max_tokens=LONG_STREAM_TOKENS)))
            assert resp.status == 200, resp
            assert (await resp.content.readuntil(b"\n\n")).startswith(b"data: {")
            responses.append(resp)
        # All of them are counted while they stream ...
        state = wait_until(lambda: (s := picker.state())["inflight_total"] == streams and s,
                           message=lambda: f"{streams} requests in flight: {picker.state()}")
        assert state["open_streams"] == streams, state
        for resp in responses:
            resp.close()
    # ... and none once their clients are gone; the engines stopped generating for them.
    await picker.wait_drained()

    def aborted() -> int:
        return sum(fleet.state(ep)["aborted"] for ep in fleet.endpoints)

    await wait_until_async(lambda: aborted() == aborted_before + streams,
                           message=lambda: f"the engines to abort {streams} generations nobody reads: {aborted()}")
    assert all(fleet.state(ep)["running"] == 0 for ep in fleet.endpoints)


# ---------------------------------------------------------------------------------------------------------
# 7. the sidecar down: fail closed as shipped, fail open when configured
# ---------------------------------------------------------------------------------------------------------

def http1(url: str, method: str, path: str, body: bytes | None = None,
          before_body: Callable[[], object] | None = None, headers: dict[str, bytes] | None = None) -> Reply:
    """One HTTP/1.1 request on its own connection. Without `before_body` the request line, headers and body go
    out in ONE write (what a client with a small body does); with it, the headers go first, then
    `before_body()` runs, then the body. `headers` go out as their bytes."""
    parts = urlsplit(url)
    conn = HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        conn.putrequest(method, path)
        for key, value in (headers or {}).items():
            conn.putheader(key, value)
        if body is not None:
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
        if before_body is None or body is None:
            conn.endheaders(body)
        else:
            conn.endheaders()
            before_body()
            conn.send(body)
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


FAIL_CLOSED_JSON = {"error": {"message": "the endpoint picker failed or is unreachable", "type": "gateway_error",
                              "code": 500}}


def test_sidecar_down_fail_closed_and_fail_open(log_dir: Path, fleet: Fleet) -> None:
    """Fail open in FULL_DUPLEX_STREAMED holds only until the first request-body chunk went to the picker's
    stream (Envoy 1.40, envoyproxy/envoy#41276). Envoy learns of a refused picker connection one event-loop
    turn after it opened the stream, so a POST whose body arrives with its headers usually gets the 500
    even with failure_mode_allow: true; requests without a body, or whose body comes later, fail open."""
    picker = Picker(log_dir, fleet.endpoints, name="sidecar-stopped")
    body = request_body("completions", False, unique("failure-mode"))
    digest = hashlib.sha256(body).hexdigest()
    with picker.proc, \
            start_envoy(log_dir, "envoy-fail-closed", picker.port, fleet.endpoints) as closed, \
            start_envoy(log_dir, "envoy-fail-open", picker.port, fleet.endpoints, failure_mode_allow=True) as opened:
        for envoy in (closed, opened):  # both work while the sidecar runs
            reply = http1(envoy.url, "POST", "/v1/completions", body)
            assert reply.status == 200 and reply.headers["x-sim-body-sha256"] == digest, reply
        picker.proc.stop()
        assert not accepts("127.0.0.1", picker.port)
        seen = fleet.requests_seen()

        # Fail closed, as shipped: every request gets the JSON 500 and reaches no engine.
        upstream = counter(closed, "cluster.engines.upstream_rq_total")
        failed = counter(closed, f"{HCM_STAT}.ext_proc.streams_failed")
        for method, path, data in (("POST", "/v1/completions", body), ("GET", "/v1/models", None),
                                   ("POST", "/v1/chat/completions", request_body("chat", True, unique("closed")))):
            reply = http1(closed.url, method, path, data)
            assert reply.status == 500, reply
            assert json.loads(reply.body) == FAIL_CLOSED_JSON, reply
        assert counter(closed, f"{HCM_STAT}.ext_proc.streams_failed") == failed + 3
        assert counter(closed, "cluster.engines.upstream_rq_total") == upstream
        assert fleet.requests_seen() == seen

        # Fail open: routed without a picker, by override_host's round-robin fallback.
        allowed = counter(opened, f"{HCM_STAT}.ext_proc.failure_mode_allowed")
        upstream = counter(opened, "cluster.engines.upstream_rq_total")
        reply = http1(opened.url, "GET", "/v1/models")  # no body: nothing was sent to the picker but headers
        assert reply.status == 200 and reply.served_by in fleet.by_name, reply
        assert counter(opened, f"{HCM_STAT}.ext_proc.failure_mode_allowed") == allowed + 1

        def picker_failure_seen() -> bool:
            return counter(opened, f"{HCM_STAT}.ext_proc.failure_mode_allowed") == allowed + 2

        # A POST whose body reaches Envoy after it has seen the picker fail: served, its body intact.
        reply = http1(opened.url, "POST", "/v1/completions", body, before_body=lambda: wait_until(
            picker_failure_seen, message="Envoy to fail open on the dead picker"))
        assert reply.status == 200 and reply.served_by in fleet.by_name, reply
        assert reply.headers["x-sim-body-sha256"] == digest, reply
        assert counter(opened, "cluster.engines.upstream_rq_total") == upstream + 2

        # The same POST written at once (request line, headers and body in one segment): whether Envoy learns
        # of the dead picker before it hands the first body chunk to the picker's stream is a race inside
        # Envoy (a fresh Envoy loses it every time, measured; once its connection pool has failed a few times
        # it sometimes wins). Either outcome is one of the two above, never a hang or a mangled body.
        reply = http1(opened.url, "POST", "/v1/completions", body)
        if reply.status == 200:
            assert reply.served_by in fleet.by_name and reply.headers["x-sim-body-sha256"] == digest, reply
        else:
            assert reply.status == 500 and json.loads(reply.body) == FAIL_CLOSED_JSON, reply



# ---------------------------------------------------------------------------------------------------------
# 8. hostile input: a header byte a client controls never costs a request its routing (fail closed: a 500)
# ---------------------------------------------------------------------------------------------------------

def test_a_non_utf8_request_id_is_still_routed_by_the_picker(gateway: EnvoyProc, picker: Picker,
                                                             fleet: Fleet) -> None:
    tag = request_id("hostile")
    failed = counter(gateway, f"{HCM_STAT}.ext_proc.streams_failed")
    body = request_body("completions", False, unique("hostile-id"))
    reply = http1(gateway.url, "POST", "/v1/completions", body, headers={"x-request-id": tag.encode() + b"\xff"})
    assert reply.status == 200 and reply.served_by in fleet.by_name, reply
    decision = picker.decision(tag + "\ufffd")  # decoded tolerantly: the picker decided this very request
    assert decision["endpoint"] == fleet.by_name[reply.served_by], decision
    assert counter(gateway, f"{HCM_STAT}.ext_proc.streams_failed") == failed


# ---------------------------------------------------------------------------------------------------------
# 9. the default policy (lane-spread) learns each engine's speed from the first chunks the picker sees
# ---------------------------------------------------------------------------------------------------------

def test_the_default_policy_learns_engine_speeds_from_first_chunks_and_shows_its_clock(log_dir: Path,
                                                                                         fleet: Fleet) -> None:
    """`--policy lane-spread` (what `auto` runs with a tokenizer) behind the shipped picker config: one request
    at a time (each decided on an idle clock, no engine queueing), streamed back through the full-duplex path,
    so every first chunk teaches its engine's clock; the next decisions carry the learned prices and /metrics
    the clock."""
    lane = Picker(log_dir, fleet.endpoints, name="sidecar-lane", extra=("--policy", "lane-spread"))
    with lane.proc, start_envoy(log_dir, "envoy-lane", lane.port, fleet.endpoints) as envoy:
        served: list[str] = []
        tags = []
        for _ in range(12):
            tag = request_id("lane")
            reply = http1(envoy.url, "POST", "/v1/completions", request_body("completions", True, unique("lane")),
                          headers={"x-request-id": tag.encode()})
            assert reply.status == 200 and reply.served_by in fleet.by_name, reply
            served.append(fleet.by_name[reply.served_by])
            tags.append(tag)
        last = lane.decision(tags[-1])
        assert last["endpoint"] == served[-1], last
        prices = {c["endpoint"]: c.get("idle_ttft_per_token_s") for c in last["candidates"]}
        assert all(prices.get(ep) for ep in set(served[:-1])), last  # each learned from its first chunks
        assert all(p is None or p > 0 for p in prices.values()), prices
        with urllib.request.urlopen(f"http://{lane.metrics}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        for ep in set(served):
            assert f'loadaware_endpoint_prefill_lane_seconds{{endpoint="{ep}"}}' in text, text
