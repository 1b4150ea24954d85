"""End to end through the real Envoy, the real LMCache controller, the real sidecar and 3 simulated engines.

One stack for the module; tests that need another sidecar configuration swap the sidecar process only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tokenizers import Tokenizer

from loadaware.policies import Candidate
from loadaware.policies.loadaware import loadaware_scores
from testkit.loopback_lock import loopback_lock
from testkit.metrics_text import metric_sum
from testkit.ports import free_port
from testkit.require import requires_lmcache
from testkit.sidecar import SidecarProc
from testkit.stack import Stack
from tests.conftest import wait_until

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "sim" / "assets" / "tiny-model"
WORDS = [
    "the", "engine", "cache", "prefix", "token", "model", "latency", "load", "balance", "router", "gateway",
    "envoy", "cluster", "query", "answer", "document", "context", "summary", "question", "policy", "score",
    "matched", "prompt", "decode", "prefill", "batch",
]

pytestmark = [pytest.mark.e2e, requires_lmcache()]


def long_text(seed: int, words: int = 700) -> str:
    return " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] for i in range(words)) + f" topic{seed}."


# ---------------------------------------------------------------------------------------------------------
# fixtures and helpers
# ---------------------------------------------------------------------------------------------------------

class Harness:
    def __init__(self, stack: Stack, log_dir: Path) -> None:
        self.stack = stack
        self.log_dir = log_dir
        self.metrics_addr = f"127.0.0.1:{free_port()}"
        self.debug_addr = f"127.0.0.1:{free_port()}"  # /debug/* is on the admin HTTP listener
        self.tokenizer = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
        assert stack.fleet is not None  # the stack has been started
        self.engine_by_name = {e["name"]: f"{e['ip']}:{e['port']}" for e in stack.fleet.engines}
        self.name_by_endpoint = {v: k for k, v in self.engine_by_name.items()}

    @property
    def url(self) -> str:
        return self.stack.url

    def base_sidecar_args(self) -> list[str]:
        assert self.stack.lmcache is not None and self.stack.fleet is not None
        return ["--listen", "127.0.0.1:9002", "--endpoints", ",".join(self.stack.fleet.endpoints),
                "--tokenizer", str(TOKENIZER), "--metrics-listen", self.metrics_addr,
                "--admin-http-listen", self.debug_addr, "--policy", "loadaware",
                "--lmcache-url", self.stack.lmcache.url, "--scrape-interval-s", "0.2", "--scrape-stale-s", "2"]

    @contextlib.contextmanager
    def sidecar(self, *extra: str, replace_lmcache: str | None = None,
                endpoints_file: str | None = None) -> Iterator[SidecarProc]:
        """Run a differently configured sidecar in place of the stack's, then put the default back."""
        args = self.base_sidecar_args()
        if replace_lmcache is not None:
            i = args.index("--lmcache-url")
            args[i + 1] = replace_lmcache
        if endpoints_file is not None:
            i = args.index("--endpoints")
            del args[i:i + 2]
            args += ["--endpoints-file", endpoints_file]
        assert self.stack.sidecar is not None
        self.stack.sidecar.stop()
        proc = SidecarProc([*args, *extra], log_dir=self.log_dir)
        try:
            proc.start(timeout=20)
            self.stack.sidecar = proc
            yield proc
        finally:
            proc.stop()
            default = SidecarProc(self.base_sidecar_args(), log_dir=self.log_dir)
            default.start(timeout=20)
            self.stack.sidecar = default

    # ---- sidecar introspection ----
    def get_json(self, url: str) -> Any:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())

    def state(self) -> dict[str, Any]:
        return self.get_json(f"http://{self.debug_addr}/debug/state")

    def last_decision(self) -> dict[str, Any]:
        return self.get_json(f"http://{self.debug_addr}/debug/decisions?n=1")[-1]

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"http://{self.metrics_addr}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return metric_sum(text, name, labels)

    def wait_inflight_zero(self) -> dict[str, Any]:
        """The sidecar's state once no request is counted in flight and no ext_proc stream is open."""
        def drained() -> dict[str, Any] | None:
            state = self.state()
            return state if state["inflight_total"] == 0 and state["open_streams"] == 0 else None

        return wait_until(drained, message=lambda: f"in-flight counts and open streams to drain: {self.state()}")

    # ---- LMCache ----
    def wait_credited(self, prompt: str, holder: str) -> None:
        """Wait until the controller credits `holder` (engine name) with this prompt's prefix."""
        assert self.stack.lmcache is not None
        tokens = self.tokenizer.encode(prompt).ids
        url = self.stack.lmcache.url + "/lookup"

        def credited() -> bool:
            req = urllib.request.Request(url, data=json.dumps({"tokens": tokens}).encode(),
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=2) as resp:
                return holder in json.loads(resp.read())["layout_info"]

        wait_until(credited, message=f"LMCache to credit {holder} with the prompt's prefix")

    # ---- engines ----
    def phantom(self, engine: str, running: int, waiting: int = 0) -> None:
        req = urllib.request.Request(f"http://{self.engine_by_name[engine]}/sim/phantom_load",
                                     data=json.dumps({"running": running, "waiting": waiting}).encode(),
                                     headers={"content-type": "application/json"})
        urllib.request.urlopen(req, timeout=2).read()

    def wait_scraped(self, engine: str, running: float) -> None:
        endpoint = self.engine_by_name[engine]
        wait_until(lambda: any(ep["endpoint"] == endpoint and ep["scraped"] and ep["scraped"]["running"] == running
                               for ep in self.state()["endpoints"]),
                   message=f"the sidecar's scrape to see {engine} running={running}")


def post(url: str, path: str, body: Any, headers: dict[str, str] | None = None,
         raw: bytes | None = None) -> tuple[int, str | None, bytes]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, resp.headers.get("x-served-by"), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("x-served-by"), err.read()


def complete(h: Harness, prompt: str, headers: dict[str, str] | None = None, **extra: Any) -> str:
    status, served_by, body = post(h.url, "/v1/completions",
                                   {"model": "tiny-model", "prompt": prompt, "max_tokens": 2, **extra}, headers)
    assert status == 200, body
    assert served_by
    return served_by


@pytest.fixture(scope="module")
def h(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    log_dir = tmp_path_factory.mktemp("e2e-routing")
    with loopback_lock():
        stack = Stack(log_dir, engines=3, lmcache=True)
        stack.start()
        try:
            harness = Harness(stack, log_dir)
            # restart the sidecar with the harness's known metrics address and a fast scrape
            assert stack.sidecar is not None
            stack.sidecar.stop()
            stack.sidecar = SidecarProc(harness.base_sidecar_args(), log_dir=log_dir).start(timeout=20)
            yield harness
        finally:
            if stack.sidecar is not None:
                stack.sidecar.stop()  # the tests may have replaced the stack's own sidecar process
            stack.stop()


@pytest.fixture(autouse=True)
def _clean_engines(h: Harness) -> Iterator[None]:
    yield
    for name in h.engine_by_name:
        h.phantom(name, 0)


def warm(h: Harness, seed: int) -> tuple[str, str]:
    """Send one request with a fresh long prefix; wait until LMCache credits its engine. (prefix, holder)"""
    prefix = long_text(seed)
    holder = complete(h, prefix + " first question?")
    h.wait_credited(prefix + " first question?", holder)
    return prefix, holder


# ---------------------------------------------------------------------------------------------------------
# (9) health, and the stream-lifetime pin
# ---------------------------------------------------------------------------------------------------------

def test_grpc_health_serving(h: Harness) -> None:
    with grpc.insecure_channel("127.0.0.1:9002") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "envoy.service.ext_proc.v3.ExternalProcessor"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_inflight_lasts_exactly_as_long_as_the_request(h: Harness) -> None:
    """Envoy keeps the BUFFERED ext_proc stream open until the HTTP request finishes (docs/architecture.md,
    "Request lifecycle"), which is what lets the sidecar count in-flight requests without any engine API: the
    count taken at decision time is held while the response streams and released right after."""
    async with aiohttp.ClientSession() as session:
        body = {"model": "tiny-model", "prompt": long_text(900), "max_tokens": 120, "stream": True}
        async with session.post(h.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            served = h.engine_by_name[resp.headers["x-served-by"]]
            await resp.content.readline()
            mid = h.state()
            assert mid["inflight"].get(served) == 1, mid
            assert mid["open_streams"] >= 1
            async for _ in resp.content:
                pass
    # Held while the response streamed (above), released once it ended. Nothing else releases a count (no
    # timer), so the wait's bound is only how long a broken release takes to fail, not a latency target.
    state = h.wait_inflight_zero()
    assert state["inflight_total"] == 0 and state["open_streams"] == 0, state


# ---------------------------------------------------------------------------------------------------------
# (1) (2) placement by the formula
# ---------------------------------------------------------------------------------------------------------

def test_warm_prefix_goes_to_its_holder_when_loads_are_even(h: Harness) -> None:
    for seed in (1, 2, 3):
        prefix, holder = warm(h, seed)
        for q in range(3):
            assert complete(h, prefix + f" follow-up {q}?") == holder
            decision = h.last_decision()
            assert decision["outcome"] == "routed"
            by_ep = {c["endpoint"]: c for c in decision["candidates"]}
            assert by_ep[h.engine_by_name[holder]]["matched_tokens"] >= 256


def _assert_formula(decision: dict[str, Any], beta: float) -> None:
    cands = [Candidate(c["endpoint"], c["matched_tokens"], c["load"]) for c in decision["candidates"]]
    expected = loadaware_scores(decision["prompt_tokens"], cands, beta)
    assert [c["score"] for c in decision["candidates"]] == pytest.approx(expected)
    best = max(expected)
    assert decision["endpoint"] in [c.endpoint for c, s in zip(cands, expected) if s >= best - 1e-9]


def test_loaded_holder_loses_to_idle_engine_and_kvaware_does_not_move(h: Harness) -> None:
    prefix, holder = warm(h, 11)
    h.phantom(holder, 12)
    # kvaware first: once loadaware has moved the prefix, a second engine holds it too (and stock LMCache
    # credits only the first registered holder, which may then be the new one).
    with h.sidecar("--policy", "kvaware"):
        h.wait_scraped(holder, 12)
        assert complete(h, prefix + " kvaware under load?") == holder
        decision = h.last_decision()
        assert decision["outcome"] == "routed"
        assert max(decision["candidates"], key=lambda c: c["load"])["endpoint"] == h.engine_by_name[holder]

    h.wait_scraped(holder, 12)
    moved_to = complete(h, prefix + " under load?")
    decision = h.last_decision()
    assert moved_to != holder
    _assert_formula(decision, beta=1.0)
    by_ep = {c["endpoint"]: c for c in decision["candidates"]}
    holder_row = by_ep[h.engine_by_name[holder]]
    assert holder_row["matched_tokens"] > 0 and holder_row["load"] >= 12
    # the formula's own numbers: benefit ~1 on the holder cannot pay for 12 requests over an idle fleet
    assert holder_row["score"] < by_ep[h.engine_by_name[moved_to]]["score"]


def test_mildly_loaded_holder_keeps_its_prefix_at_lower_beta(h: Harness) -> None:
    """One request over an idle fleet of 3: relative loads +2/3, -1/3, -1/3. At beta 0.5 a holder with
    benefit b keeps the prefix while b - 1/3 >= 1/6, i.e. b >= 1/2 (here b = 512/713 ~ 0.72)."""
    prefix, holder = warm(h, 12)
    with h.sidecar("--loadaware-beta", "0.5"):
        h.phantom(holder, 1)
        h.wait_scraped(holder, 1)
        served = complete(h, prefix + " light load?")
        decision = h.last_decision()
        _assert_formula(decision, beta=0.5)
        assert served == holder, json.dumps(decision)


# ---------------------------------------------------------------------------------------------------------
# (3) chat
# ---------------------------------------------------------------------------------------------------------

def test_chat_requests_match_their_prefix(h: Harness) -> None:
    system = long_text(21)
    first: dict[str, Any] = {"model": "tiny-model", "max_tokens": 2,
                             "messages": [{"role": "system", "content": system},
                                          {"role": "user", "content": "hello?"}]}
    status, holder, _ = post(h.url, "/v1/chat/completions", first)
    assert status == 200 and holder
    # until the controller holds the templated prefix, a different question following it is matched nowhere
    second = {**first, "messages": [first["messages"][0],
                                    {"role": "user", "content": [{"type": "text", "text": "another"},
                                                                 {"type": "text", "text": "question"}]}]}

    def matched_somewhere() -> tuple[str | None, dict[str, Any]] | None:
        status, served_by, _ = post(h.url, "/v1/chat/completions", second)
        assert status == 200
        decision = h.last_decision()
        matched = decision["candidates"] and max(c["matched_tokens"] for c in decision["candidates"]) > 0
        return (served_by, decision) if matched else None

    served_by, decision = wait_until(matched_somewhere, message="a chat request matched on its templated prefix")
    assert served_by == holder
    by_ep = {c["endpoint"]: c for c in decision["candidates"]}
    assert by_ep[h.engine_by_name[holder]]["matched_tokens"] >= 512


# ---------------------------------------------------------------------------------------------------------
# (4) (5) spoofing and a dead sidecar
# ---------------------------------------------------------------------------------------------------------

def test_spoofed_destination_is_never_honoured_with_the_sidecar_up(h: Harness) -> None:
    prefix, holder = warm(h, 31)
    others = [ep for name, ep in h.engine_by_name.items() if name != holder]
    for q, target in enumerate(others * 3):
        served = complete(h, prefix + f" spoof {q}?", headers={"x-gateway-destination-endpoint": target})
        assert served == holder


def test_sidecar_down_every_request_served_and_spoof_still_ignored(h: Harness) -> None:
    assert h.stack.sidecar is not None
    h.stack.sidecar.stop()
    try:
        target = h.engine_by_name["engine-1"]
        served = [complete(h, f"short prompt {i}", headers={"x-gateway-destination-endpoint": target})
                  for i in range(30)]
        assert len(served) == 30
        assert len(set(served)) >= 2, served  # least_request fallback spreads; the spoof would pin engine-1
    finally:
        h.stack.sidecar = SidecarProc(h.base_sidecar_args(), log_dir=h.log_dir).start(timeout=20)


# ---------------------------------------------------------------------------------------------------------
# (6) LMCache down or slow
# ---------------------------------------------------------------------------------------------------------

def test_lmcache_down_load_only_decisions_and_counted(h: Harness) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with h.sidecar(replace_lmcache=dead):
        served = {complete(h, long_text(41) + f" q{i}") for i in range(12)}
        decision = h.last_decision()
        assert decision["outcome"] == "fallback_load_only"
        assert "lmcache_error" in decision["reasons"]
        assert h.metric("loadaware_fallbacks_total", reason="lmcache_error") == 12
        assert h.metric("loadaware_decisions_total", outcome="fallback_load_only") == 12
        assert served  # every request answered 200 (asserted in complete)
        assert h.wait_inflight_zero()["inflight_total"] == 0


def test_lmcache_slow_is_time_boxed(h: Harness, tmp_path: Path) -> None:
    from aiohttp import web

    # The stand-in controller holds every lookup until the test ends: a request can only be answered by
    # the sidecar giving up at its time box, whatever the machine's speed.
    release = asyncio.Event()  # set from this thread through the server's loop
    lookups = {"received": 0, "answered": 0}

    async def held_lookup(_request: web.Request) -> web.Response:
        lookups["received"] += 1
        await release.wait()
        lookups["answered"] += 1
        return web.json_response({"event_id": "x", "layout_info": {}})

    async def no_workers(_request: web.Request) -> web.Response:
        return web.json_response({"event_id": "x", "worker_infos": []})

    port = free_port()
    ready = __import__("threading").Event()
    loop = asyncio.new_event_loop()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        app = web.Application()
        app.router.add_post("/lookup", held_lookup)
        app.router.add_post("/query_worker_info", no_workers)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()

    thread = __import__("threading").Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(5)
    try:
        with h.sidecar("--lmcache-timeout-ms", "50", replace_lmcache=f"http://127.0.0.1:{port}"):
            for i in range(5):
                complete(h, long_text(42) + f" q{i}")
            # served while every lookup is still unanswered: never waits for the controller
            assert lookups["received"] >= 1 and lookups["answered"] == 0, lookups
            assert h.metric("loadaware_fallbacks_total", reason="lmcache_timeout") == 5
            # ...but does wait out its time box (50 ms) before deciding on load alone
            assert h.last_decision()["stages_ms"]["lookup"] >= 45
    finally:
        loop.call_soon_threadsafe(release.set)
        loop.call_soon_threadsafe(loop.stop)


def test_tokenizer_failure_degrades_to_load_only(h: Harness) -> None:
    # chat with a role the template cannot render (no content) still gets served
    body = {"model": "tiny-model", "max_tokens": 2, "messages": [{"role": "user", "content": None}]}
    _status, served_by, _ = post(h.url, "/v1/chat/completions", body)
    assert served_by  # the engine answered (its own verdict on the odd message is its business)
    decision = h.last_decision()
    assert decision["endpoint"] is not None


# ---------------------------------------------------------------------------------------------------------
# (7) counts always return to zero
# ---------------------------------------------------------------------------------------------------------

async def test_inflight_returns_to_zero_after_streams_aborts_and_errors(h: Harness) -> None:
    async with aiohttp.ClientSession() as session:
        async def stream(i: int) -> None:
            body = {"model": "tiny-model", "prompt": long_text(50 + i % 4) + f" s{i}", "max_tokens": 8,
                    "stream": True}
            async with session.post(h.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                text = await resp.text()
                assert "[DONE]" in text

        async def client_abort(i: int) -> None:
            body = {"model": "tiny-model", "prompt": long_text(60) + f" a{i}", "max_tokens": 200, "stream": True}
            resp = await session.post(h.url + "/v1/completions", json=body)
            await resp.content.readline()
            resp.close()  # the client walks away mid-stream

        async def upstream_error(i: int) -> None:
            body = {"model": "tiny-model", "prompt": f"fail {i}", "max_tokens": 2}
            async with session.post(h.url + "/v1/completions", json=body, headers={"x-sim-fail": "500"}) as resp:
                assert resp.status == 500
                await resp.read()

        async def upstream_abort(i: int) -> None:
            body = {"model": "tiny-model", "prompt": f"abort {i}", "max_tokens": 50, "stream": True}
            with contextlib.suppress(aiohttp.ClientError):
                async with session.post(h.url + "/v1/completions", json=body,
                                        headers={"x-sim-abort-after": "2"}) as resp:
                    await resp.read()

        jobs = [stream(i) for i in range(12)] + [client_abort(i) for i in range(6)] + \
               [upstream_error(i) for i in range(6)] + [upstream_abort(i) for i in range(6)]
        await asyncio.gather(*jobs)
    state = h.wait_inflight_zero()
    assert state["inflight_total"] == 0, state
    assert state["open_streams"] == 0, state
    assert all(ep["inflight"] == 0 for ep in state["endpoints"])


# ---------------------------------------------------------------------------------------------------------
# (8) bad input: a clear outcome, and the sidecar stays healthy
# ---------------------------------------------------------------------------------------------------------

def test_bad_input_gets_clear_outcomes(h: Harness) -> None:
    status, served_by, body = post(h.url, "/v1/completions", None, raw=b"{not json")
    assert status == 400 and served_by is None  # answered by the sidecar, never reached an engine
    error = json.loads(body)["error"]
    assert error["message"] == "request body is not valid JSON" and error["type"] == "invalid_request_error"

    status, served_by, body = post(h.url, "/v1/completions", None, raw=b"[1,2,3]")
    assert status == 400 and "JSON object" in json.loads(body)["error"]["message"]

    status, served_by, _ = post(h.url, "/v1/completions", {"model": "tiny-model", "max_tokens": 2})
    assert served_by is not None  # no prompt: routed on load, the engine gives its own verdict
    assert "no_prompt" in h.last_decision()["reasons"]

    streams_before = h.metric("loadaware_extproc_streams_total")
    status, served_by, _ = post(h.url, "/v1/embeddings", {"input": "x"})
    assert served_by is not None and status == 404  # unknown path: passed through untouched
    with urllib.request.urlopen(h.url + "/v1/models", timeout=5) as resp:
        assert resp.status == 200 and json.loads(resp.read())["data"]
    # the shipped Envoy config sends only the two inference paths to the sidecar
    assert h.metric("loadaware_extproc_streams_total") == streams_before

    huge = json.dumps({"model": "tiny-model", "prompt": "x " * (5 * 1024 * 1024)}).encode()
    status, served_by, body = post(h.url, "/v1/completions", None, raw=huge)
    assert status == 413 and json.loads(body)["error"]["type"] == "request_too_large"

    test_grpc_health_serving(h)
    assert complete(h, "still fine?")


def test_empty_fleet_falls_back_to_envoy_and_is_counted(h: Harness, tmp_path: Path) -> None:
    endpoints_file = tmp_path / "endpoints.txt"
    endpoints_file.write_text(h.engine_by_name["engine-0"] + "\n")
    with h.sidecar(endpoints_file=str(endpoints_file)):
        assert complete(h, "one engine fleet") == "engine-0"
        endpoints_file.write_text("# nobody home\n")
        wait_until(lambda: not h.state()["endpoints"], message="the sidecar to re-read the emptied endpoints file")
        served = {complete(h, f"empty fleet {i}") for i in range(10)}
        assert len(served) >= 2  # Envoy's least_request fallback, not a pinned engine
        assert h.metric("loadaware_fallbacks_total", reason="no_endpoints") == 10
        assert h.metric("loadaware_decisions_total", outcome="no_endpoints") == 10
        # an emptied fleet makes the sidecar report NOT_SERVING, but it keeps answering streams
        with grpc.insecure_channel("127.0.0.1:9002") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


# ---------------------------------------------------------------------------------------------------------
# hostile input: bytes a client controls never cost a request its routing
# ---------------------------------------------------------------------------------------------------------

def test_a_non_utf8_request_id_is_still_routed_by_the_sidecar(h: Harness) -> None:
    errors = h.metric("loadaware_extproc_streams_total", end="error")
    # urllib sends a str header as latin-1: "\xff" is the single byte 0xFF, not valid UTF-8
    served = complete(h, "a prompt sent with a hostile request id", headers={"x-request-id": "hostile-\xff-id"})
    decision = h.last_decision()
    assert decision["request_id"] == "hostile-\ufffd-id", decision  # decoded tolerantly, not the fallback's
    assert decision["endpoint"] == h.engine_by_name[served] and decision["outcome"] in ("routed",
                                                                                         "fallback_load_only")
    assert h.metric("loadaware_extproc_streams_total", end="error") == errors


def test_a_deeply_nested_body_gets_a_json_400(h: Harness) -> None:
    errors = h.metric("loadaware_extproc_streams_total", end="error")
    rejected = h.metric("loadaware_fallbacks_total", reason="nesting_too_deep")
    status, _, body = post(h.url, "/v1/completions", None, raw=b"[" * 200_000 + b"]" * 200_000)
    assert status == 400, body
    error = json.loads(body)["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error", error
    assert error["message"] == "request body nests deeper than 64 levels", error
    assert h.metric("loadaware_fallbacks_total", reason="nesting_too_deep") == rejected + 1
    assert h.metric("loadaware_extproc_streams_total", end="error") == errors
    assert complete(h, "and the next request is routed as usual")


# ---------------------------------------------------------------------------------------------------------
# lane-spread: the engines' KV capacity and the fleet's working set, through Envoy
# ---------------------------------------------------------------------------------------------------------

def test_lane_spread_reads_the_engines_kv_capacity_and_counts_the_routed_working_set(h: Harness) -> None:
    with h.sidecar("--policy", "lane-spread"):
        def capacities() -> list[float] | None:
            rows = h.state()["endpoints"]
            got = [r["scraped"]["kv_capacity_tokens"] for r in rows if r["scraped"]]
            return got if len(got) == len(rows) and all(got) else None

        total = sum(wait_until(capacities, message="every engine's cache_config_info scraped"))
        assert h.metric("loadaware_fleet_kv_capacity_tokens") == total == h.state()["fleet_kv_capacity_tokens"]
        prompt = long_text(31)
        first = complete(h, f"{prompt} question 0?")
        h.wait_credited(f"{prompt} question 0?", first)  # later decisions see the prefix held
        for i in range(1, 4):
            complete(h, f"{prompt} question {i}?")
        ws = h.state()["working_set"]
        # one prompt head, seen 4 times; the prompt's sampled blocks recur (its suffix is below the sampling)
        assert (ws["heads"], ws["singleton_heads"], ws["capacity_blocks"]) == (1, 0, total / 16)
        assert ws["recurring_blocks"] > 0 and 0 < ws["demand"] < 1
        assert h.metric("loadaware_prefix_working_set_tokens") == ws["recurring_blocks"] * 16
        assert h.metric("loadaware_prefix_working_set_new_heads") == 0
        last = h.last_decision()
        assert last["outcome"] == "routed"
        # The 4th decision saw the working set after 3 routes (the prefix's blocks recurred from the 2nd on):
        # its held prefix routed 3 times, once per engine, and room in the caches: it counted every request in
        # flight (docs/architecture.md, "lane-spread").
        assert [(c["cache_demand"], c["prefix_routes"]) for c in last["candidates"]] == [
            (pytest.approx(ws["demand"]), 3.0)] * 3


def test_lane_spread_credits_a_queueing_engine_with_the_prompt_routed_there(h: Harness) -> None:
    """Every engine reports an admission queue (phantom waiting): a long request routed there is held by the
    queued-prefix index while its stream is open, a second request for the same prefix follows it to its
    engine, and both holds are given back when the streams end (docs/architecture.md, "Prompts queued at
    engines")."""
    with h.sidecar("--policy", "lane-spread"):
        for name in h.engine_by_name:
            h.phantom(name, 0, waiting=3)
        wait_until(lambda: all(ep["scraped"] and ep["scraped"]["waiting"] == 3 for ep in h.state()["endpoints"]),
                   message="every engine's admission queue scraped")
        prompt = long_text(41)
        first: dict[str, Any] = {}

        def long_stream() -> None:  # a request that stays in flight for seconds: 400 streamed tokens
            first["reply"] = post(h.url, "/v1/completions", {"model": "tiny-model", "prompt": f"{prompt} one?",
                                                            "max_tokens": 400, "ignore_eos": True})

        thread = threading.Thread(target=long_stream)
        thread.start()
        try:
            held = wait_until(lambda: h.state()["queued_prefixes"]["blocks"] or None,
                              message="the first request held while its engine queues")
            (holder, keys), = held.items()
            second = complete(h, f"{prompt} two?")
            assert h.engine_by_name[second] == holder  # followed the first into its engine's queue
            by = {c["endpoint"]: c for c in h.last_decision()["candidates"]}
            assert by[holder]["matched_tokens"] >= keys * 64  # what the held request holds, at least
        finally:
            thread.join(timeout=60)
        status, served_by, _ = first["reply"]
        assert status == 200 and h.engine_by_name[served_by] == holder
        wait_until(lambda: h.state()["queued_prefixes"]["total_blocks"] == 0 or None,
                   message="both holds given back when their streams ended")
        assert h.metric("loadaware_prefix_queued_blocks") == 0
