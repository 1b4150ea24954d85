"""loadaware.v1.Router in process: Explain runs the real pipeline without counting, shows the formula's
terms; ListEndpoints shows discovery health and scrapes; GetConfig shows origins."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from loadaware.api import explain
from loadaware.api.servicer import RouterServicer
from loadaware.api.v1 import loadaware_pb2 as pb
from loadaware.api.v1 import loadaware_pb2_grpc as pb_grpc
from loadaware.api.view import DecisionView, FleetView, PrefixView, ProcessView, SidecarView
from loadaware.config import resolve
from loadaware.fleet.discovery.catalog import DiscoveredEndpoint, DiscoveryCatalog
from loadaware.fleet.health import EndpointHealth, HealthOptions
from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import RequestLifecycle
from loadaware.load.signals import SignalTracker
from loadaware.load.tracker import EngineStats, LoadTracker
from loadaware.policies import Candidate, make_policy
from loadaware.policies.loadaware import loadaware_scores
from loadaware.prefix.approx import ApproxIndex, ApproxPrefixSource
from loadaware.prefix.lmcache.bridge import InstanceBridge
from loadaware.routing.builder import build_decider
from loadaware.routing.request import parse_body
from loadaware.telemetry.decisions import DecisionMetrics, RecentDecisions
from loadaware.telemetry.metrics import Metrics
from loadaware.tokenize.tokenizer import AsyncTokenizer, PromptTokenizer

FLEET = ("127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000")


class FixedSource:
    name = "fixed"

    def __init__(self, answer: dict[str, int]) -> None:
        self.answer = answer

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        return {ep: min(n, len(tokens)) for ep, n in self.answer.items()}


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


class AlwaysReady:
    def ready(self) -> bool:
        return True

    def reason(self) -> str:
        return ""


class NoStreams:
    def __init__(self) -> None:
        self.open_streams = 0
        self.modes: dict[str, int] = {}


class NoPrefixSources:
    def state(self) -> dict[str, object]:
        return {}

    def refresh_gauges(self) -> None:
        pass


def build(policy: str = "loadaware", answer: dict[str, int] | None = None,
          discovered: list[DiscoveredEndpoint] | None = None) -> tuple[RouterServicer, Any]:
    settings = resolve({"policy": policy, "loadaware_beta": "0.5", "endpoints": ",".join(FLEET)}, {})
    registry = EndpointRegistry(FLEET)
    clock = Clock()
    loads = inflight = LoadTracker(stale_s=5.0, clock=clock)
    metrics = Metrics(policy)
    recent = RecentDecisions()
    lifecycle = RequestLifecycle()
    for listener in (loads, DecisionMetrics(metrics), recent):
        lifecycle.subscribe(listener)
    tokenizer = AsyncTokenizer(PromptTokenizer("sim/assets/tiny-model"), timeout_s=5.0)
    health = EndpointHealth(HealthOptions(failures_to_eject=1), clock=clock)
    lifecycle.subscribe(health)
    lifecycle.subscribe_outcomes(health)
    decider = build_decider(make_policy(policy, 0.5), registry, loads, lifecycle, tokenizer, FixedSource(answer or {}),
                      health=health)
    bridge = InstanceBridge({"engine-1": FLEET[1]})
    bridge.set_endpoints(FLEET)
    catalog = DiscoveryCatalog("static", registry)
    if discovered is not None:
        catalog = DiscoveryCatalog("kubernetes", registry)
        catalog.apply(discovered)
    view = SidecarView(FleetView(registry, catalog, loads, health), PrefixView(NoPrefixSources(), bridge),
                       DecisionView(decider, settings.effective_policy, settings.loadaware_beta),
                       ProcessView(AlwaysReady(), lambda: [], NoStreams(), settings.describe))
    servicer = RouterServicer(view)
    return servicer, type("Parts", (), {"loads": loads, "inflight": inflight, "metrics": metrics,
                                        "clock": clock, "decider": decider, "recent": recent, "health": health,
                                        "lifecycle": lifecycle})


def struct_request(body: dict[str, Any], path: str = "/v1/completions") -> pb.ExplainRequest:
    request = pb.ExplainRequest(path=path)
    json_format.ParseDict(body, request.body)
    return request


PROMPT = "the engine cache prefix token " * 60


async def test_explain_shows_matches_loads_and_the_formula_without_counting() -> None:
    servicer, parts = build(answer={FLEET[1]: 256})
    parts.loads.record(FLEET[1], EngineStats(running=6, waiting=2, kv_usage=0.4, at=parts.clock.now - 1.5))
    lease = parts.inflight.acquire(FLEET[0])
    reply = await servicer.Explain(struct_request({"prompt": PROMPT, "max_tokens": 8}), None)
    assert reply.outcome == "routed" and reply.kind == "completions" and reply.policy == "loadaware"
    assert reply.beta == 0.5 and "relative_load" in reply.formula
    by_ep = {e.endpoint: e for e in reply.endpoints}
    holder = by_ep[FLEET[1]]
    assert holder.matched_tokens == 256 and holder.lmcache_instance_id == "engine-1"
    assert holder.benefit == pytest.approx(256 / reply.prompt_tokens)
    assert holder.scraped.running == 6 and holder.scraped.waiting == 2 and holder.scraped.fresh
    assert holder.scraped.age_seconds == pytest.approx(1.5)
    assert by_ep[FLEET[0]].inflight == 1 and by_ep[FLEET[0]].load == 1
    # the scores are the formula's, term by term
    candidates = [Candidate(e.endpoint, e.matched_tokens, e.load) for e in reply.endpoints]
    expected = loadaware_scores(reply.prompt_tokens, candidates, 0.5)
    assert [e.score for e in reply.endpoints] == pytest.approx(expected)
    mean = sum(e.load for e in reply.endpoints) / 3
    assert reply.mean_load == pytest.approx(mean)
    for e in reply.endpoints:
        assert e.relative_load == pytest.approx((e.load - mean) / max(1.0, mean))
        assert e.score == pytest.approx(e.benefit - 0.5 * e.relative_load)
    best = max(reply.endpoints, key=lambda e: e.score)
    assert best.chosen and reply.endpoint == best.endpoint
    # nothing was counted: in-flight as before, no decision recorded, nothing in the recent list
    assert parts.inflight.snapshot() == {FLEET[0]: 1}
    assert not parts.recent.items
    decided = [s for m in parts.metrics.decisions.collect() for s in m.samples if s.name.endswith("_total")]
    assert decided == []
    parts.inflight.release(lease)


async def test_explain_chat_passthrough_and_rejections() -> None:
    servicer, _ = build()
    chat = await servicer.Explain(struct_request({"messages": [{"role": "user", "content": "hi"}]},
                                                 "/v1/chat/completions"), None)
    assert chat.kind == "chat" and chat.prompt_tokens > 0 and chat.outcome == "routed"
    other = await servicer.Explain(pb.ExplainRequest(path="/v1/models"), None)
    assert other.outcome == "passthrough"
    bad = await servicer.Explain(pb.ExplainRequest(raw_body="{not json"), None)
    assert bad.outcome == "rejected" and bad.reasons == ["invalid_json"] and bad.message
    no_prompt = await servicer.Explain(struct_request({"model": "m"}), None)
    assert no_prompt.outcome == "fallback_load_only" and list(no_prompt.reasons) == ["no_prompt"]


def test_struct_numbers_come_back_as_ints() -> None:
    request = struct_request({"prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0.5})
    body = explain.body_bytes(request)
    assert json.loads(body) == {"prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0.5}
    assert isinstance(json.loads(body)["max_tokens"], int)  # an int on the wire, not 8.0 (Struct order varies)
    assert b'"max_tokens": 8.0' not in body
    assert explain.body_bytes(pb.ExplainRequest(raw_body='{"prompt":"x"}')) == b'{"prompt":"x"}'


async def test_explain_does_not_use_up_round_robins_turn() -> None:
    servicer, parts = build(policy="roundrobin")
    first = await servicer.Explain(struct_request({"prompt": "x"}), None)
    again = await servicer.Explain(struct_request({"prompt": "x"}), None)
    assert first.endpoint == again.endpoint == FLEET[0]
    real = await parts.decider.decide(None, "r1")
    assert real.endpoint == FLEET[0]  # the real next request still gets the turn Explain predicted
    parts.inflight.release(real.lease)


async def test_list_endpoints_shows_discovery_health_and_scrapes() -> None:
    discovered = [DiscoveredEndpoint(FLEET[0], instance_id="vllm-0", pod="vllm-0", zone="a"),
                  DiscoveredEndpoint(FLEET[1], instance_id="vllm-1", pod="vllm-1"),
                  DiscoveredEndpoint("127.0.0.9:8000", "DRAINING", "terminating", instance_id="vllm-9",
                                     pod="vllm-9")]
    servicer, parts = build(discovered=discovered)
    parts.loads.record(FLEET[0], EngineStats(running=3, waiting=1, kv_usage=None, at=parts.clock.now - 9))
    reply = await servicer.ListEndpoints(pb.ListEndpointsRequest(), None)
    assert reply.discovery == "kubernetes" and reply.ready
    rows = {e.endpoint: e for e in reply.endpoints}
    assert list(rows) == [FLEET[0], FLEET[1], "127.0.0.9:8000"]
    assert rows[FLEET[0]].routable and rows[FLEET[0]].pod == "vllm-0" and rows[FLEET[0]].zone == "a"
    assert rows[FLEET[0]].last_scrape.running == 3 and not rows[FLEET[0]].last_scrape.fresh  # 9 s > 5 s
    assert not rows[FLEET[0]].last_scrape.HasField("kv_cache_usage")
    assert rows[FLEET[1]].lmcache_instance_id == "engine-1"  # the bridge's live map wins
    gone = rows["127.0.0.9:8000"]
    assert not gone.routable and gone.health == pb.DRAINING and gone.health_detail == "terminating"


async def test_failing_engines_show_in_explain_and_list_endpoints() -> None:
    servicer, parts = build(answer={FLEET[1]: 256})
    parts.health.failed(FLEET[1], "http_5xx")  # the prefix holder fails: out of rotation for 1 s
    reply = await servicer.Explain(struct_request({"prompt": PROMPT, "max_tokens": 8}), None)
    assert list(reply.excluded) == [FLEET[1]]
    assert [e.endpoint for e in reply.endpoints] == [FLEET[0], FLEET[2]]
    assert {e.routing_state for e in reply.endpoints} == {"healthy"} and reply.outcome == "routed"
    rows = {e.endpoint: e for e in (await servicer.ListEndpoints(pb.ListEndpointsRequest(), None)).endpoints}
    out = rows[FLEET[1]].routing_health
    assert out.state == "ejected" and out.reason == "http_5xx" and dict(out.failures) == {"http_5xx": 1}
    assert out.ejections == 1 and out.ejected_for_seconds == pytest.approx(1.0)
    assert rows[FLEET[0]].routing_health.state == "healthy"
    parts.clock.now += 1.0  # due for its probe: a candidate again, shown as probing
    reply = await servicer.Explain(struct_request({"prompt": PROMPT, "max_tokens": 8}), None)
    assert not reply.excluded
    probing = next(e for e in reply.endpoints if e.endpoint == FLEET[1])
    assert probing.routing_state == "probing" and probing.chosen  # it holds the prefix
    for ep in FLEET:  # every engine failing: at most half are left out (Envoy's cap), the soonest due return
        parts.health.failed(ep, "http_5xx")
    reply = await servicer.Explain(struct_request({"prompt": PROMPT, "max_tokens": 8}), None)
    assert list(reply.excluded) == [FLEET[1]]  # ejected for the second time in a row: due back last
    assert len(reply.endpoints) == 2 and "all_endpoints_failing" not in reply.reasons
    assert reply.outcome == "routed"
    parts.health.options = HealthOptions(failures_to_eject=1, max_ejection_percent=100)
    reply = await servicer.Explain(struct_request({"prompt": PROMPT, "max_tokens": 8}), None)
    assert len(reply.endpoints) == 3 and not reply.excluded and "all_endpoints_failing" in reply.reasons


def observable_state(servicer: RouterServicer, parts: Any) -> dict[str, Any]:
    """Everything a decision could leave a trace in: metrics, health, caches, memos, counts, the ring."""
    decider = parts.decider
    tokenizer = decider.producers.tokenizer
    pieces = tokenizer.tokenizer.pieces
    approx = decider.producers.prefix_source
    return {
        "metrics": parts.metrics.render(parts.loads.snapshot, FLEET),
        "health": [parts.health.view(ep) for ep in FLEET], "health_states": [parts.health.state(ep) for ep in FLEET],
        "health_records": {ep: (r.state, r.probe, r.consecutive) for ep, r in parts.health._records.items()},
        "pieces": (list(pieces._cache), pieces.hits, pieces.misses, pieces.cached_tokens),
        "tokenizer": (tokenizer.tokenizer._encoded, tokenizer.inline),
        "approx_memo": (approx._last_tokens, approx._last_salt, list(approx._last_keys), dict(approx._last_answer)),
        "approx_index": {ep: approx.index.blocks(ep) for ep in FLEET},
        "loads": parts.loads.snapshot(), "recent": len(parts.recent.last(1000)),
        "policy": dict(vars(decider.policy)),
    }


@pytest.mark.parametrize("policy", ["loadaware", "roundrobin"])
async def test_explain_is_read_only(policy: str) -> None:
    """No metric, health, cache or memo changes: Explain run many times leaves every observable as it was."""
    servicer, parts = build(policy=policy)
    index = ApproxIndex(capacity_blocks=1000, block_size=16, ttl_s=60)
    approx = parts.decider.producers.prefix_source = ApproxPrefixSource(index, parts.metrics, clock=parts.clock)
    parts.lifecycle.subscribe(approx)
    for i in range(3):  # real traffic first: a warm piece cache, a guess in the index, a memo
        real = await parts.decider.decide(await _parsed(PROMPT + f" real {i}"), f"r{i}")
        parts.lifecycle.ended(real)
    parts.health.failed(FLEET[2], "http_5xx")
    parts.clock.now += 5  # FLEET[2] is due for its probe: asking must not start one
    before = observable_state(servicer, parts)
    for text in (PROMPT, PROMPT + " other", "short", "brand new text " * 300):
        for path, body in (("/v1/completions", {"prompt": text}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]})):
            reply = await servicer.Explain(struct_request(body, path), None)
            assert reply.outcome == "routed", reply
    assert observable_state(servicer, parts) == before


async def _parsed(prompt: str) -> Any:
    return parse_body("completions", json.dumps({"prompt": prompt}).encode())


async def test_get_config_reports_origins() -> None:
    servicer, _ = build()
    reply = await servicer.GetConfig(pb.GetConfigRequest(), None)
    rows = {s.name: s for s in reply.settings}
    assert rows["policy"].origin == "flag" and rows["policy"].value.string_value == "loadaware"
    assert rows["loadaware_beta"].value.number_value == 0.5
    assert rows["endpoints"].value.list_value.values[0].string_value == FLEET[0]
    assert rows["discovery"].value.string_value == "static" and rows["discovery"].origin == "default"
    assert rows["scrape_interval_s"].origin == "default"


async def test_served_over_grpc() -> None:
    servicer, _ = build()
    server = grpc.aio.server()
    servicer.add_to(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.RouterStub(channel)
            reply = await stub.Explain(struct_request({"prompt": "hello"}))
            assert reply.outcome == "routed"
            listed = await stub.ListEndpoints(pb.ListEndpointsRequest())
            assert len(listed.endpoints) == 3
    finally:
        await server.stop(None)


async def test_explain_and_list_endpoints_show_the_working_set_and_the_kv_capacity() -> None:
    servicer, parts = build("lane-spread", answer={FLEET[1]: 10_000})
    for ep in FLEET:
        parts.loads.record(ep, EngineStats(0, 0, None, parts.clock.now, kv_capacity_tokens=90_000))
    lines = PROMPT * 4  # 1,200+ tokens: more than one sampled block
    ws = parts.decider.working_set
    for i in range(2):  # routed twice: its head is no longer new, its blocks recur
        await parts.decider.decide(parse_body("completions", json.dumps({"prompt": lines}).encode()), f"r{i}")
    reply = await servicer.Explain(struct_request({"prompt": lines, "max_tokens": 8}), None)
    view = reply.working_set
    assert reply.policy == "lane-spread" and view.HasField("cache_demand")
    assert view.cache_demand == pytest.approx(ws.recurring_blocks() / ws.capacity_blocks) and view.cache_demand > 0
    assert view.prefix_routes == 2 and view.spreading is False  # 2 routes < 3 candidates
    listed = await servicer.ListEndpoints(pb.ListEndpointsRequest(), None)
    assert {e.last_scrape.kv_capacity_tokens for e in listed.endpoints} == {90_000}
    plain, _ = build("loadaware")
    assert not (await plain.Explain(struct_request({"prompt": lines}), None)).HasField("working_set")


async def test_explain_shows_what_prompts_queued_at_an_endpoint_credit() -> None:
    servicer, parts = build("lane-spread")
    parts.decider.signals = SignalTracker(clock=parts.clock)
    parts.loads.record(FLEET[0], EngineStats(64, 4, None, parts.clock.now))  # FLEET[0] queues
    body = json.dumps({"prompt": PROMPT * 4}).encode()
    first = await parts.decider.decide(parse_body("completions", body), "r1", subset=frozenset({FLEET[0]}))
    assert first.endpoint == FLEET[0] and first.queued is not None
    reply = await servicer.Explain(struct_request({"prompt": PROMPT * 4}), None)
    by = {e.endpoint: e for e in reply.endpoints}
    full = first.prompt_tokens // 64 * 64  # held keys stand for 4 blocks of 16 tokens
    assert by[FLEET[0]].queued_tokens == by[FLEET[0]].matched_tokens == full
    assert by[FLEET[1]].queued_tokens == 0 == by[FLEET[1]].matched_tokens
    assert reply.rule == ""  # some engines have free slots: lane-spread's own cost chose


async def test_explain_says_when_every_engine_queues_and_lane_spread_chose_as_loadaware() -> None:
    servicer, parts = build("lane-spread", answer={FLEET[0]: 1_000})
    parts.decider.signals = SignalTracker(clock=parts.clock)
    for ep, waiting in zip(FLEET, (30, 2, 2)):
        parts.loads.record(ep, EngineStats(64, waiting, None, parts.clock.now))
    reply = await servicer.Explain(struct_request({"prompt": PROMPT * 4}), None)
    assert reply.rule == "all_queueing" and reply.policy == "lane-spread"
    # The scores are loadaware's: the match's share of the prompt less the relative load.
    by = {e.endpoint: e for e in reply.endpoints}
    for e in by.values():
        assert e.score == pytest.approx(e.benefit - e.relative_load)
    parts.loads.record(FLEET[2], EngineStats(3, 0, None, parts.clock.now))  # one engine has free slots again
    assert (await servicer.Explain(struct_request({"prompt": PROMPT * 4}), None)).rule == ""
