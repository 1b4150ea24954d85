"""Every byte a client controls decodes and is bounded; every failing helper degrades a decision, named,
counted and logged rate-limited (docs/architecture.md, "Input bounds")."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from bench.extproc_inprocess import buffered_messages, duplex_messages
from loadaware.app import Sidecar
from loadaware.extproc.metadata import (
    MAX_LABEL_CHARS,
    MAX_REQUEST_ID_CHARS,
    headers_of,
    served_endpoint,
    status_of,
    subset_hint,
)
from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.policies import Candidate, Choice, Needs
from loadaware.routing.request import (
    MAX_BATCH_PROMPTS,
    MAX_MESSAGES,
    MAX_NESTING_DEPTH,
    MAX_PROMPT_TOKEN_IDS,
    BadRequest,
    parse_body,
)
from loadaware.telemetry.faults import ListenerFailures, RateLimitedLog
from tests.unit.test_extproc_duplex import Recorder, body_of, converse, make, with_metadata
from tests.unit.test_pipeline import FLEET, PROMPT, FixedSource
from tests.unit.test_pipeline import make as make_rig


def headers(*items: tuple[str, bytes]) -> pb.HttpHeaders:
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v)
                                                               for k, v in items]))


# ---- headers and metadata ----

def test_any_header_bytes_decode_and_the_request_id_is_bounded() -> None:
    head = headers_of(headers((":method", b"POST"), (":path", b"/v1/\xffcompletions"),
                              ("x-request-id", b"abc\xffdef"), ("", b"empty key")))
    assert (head.method, head.path, head.request_id) == ("POST", "/v1/\ufffdcompletions", "abc\ufffddef")
    assert headers_of(headers(("x-request-id", b"r" * 100_000))).request_id == "r" * MAX_REQUEST_ID_CHARS
    forged = headers_of(headers(("x-request-id", b"ok\nlevel=ERROR forged\x1b[31m"))).request_id
    assert "\n" not in forged and "\x1b" not in forged and forged.startswith("ok\\n")


def test_objective_fairness_trace_and_session_headers_are_read_bounded() -> None:
    head = headers_of(headers(("x-gateway-inference-objective", b"critical"),
                              ("x-gateway-inference-fairness-id", b"tenant\n" + b"a" * 1000),
                              ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                              ("x-session", b"s-1")), session_header="x-session")
    assert head.objective == "critical"
    assert "\n" not in head.fairness_id and len(head.fairness_id) == MAX_LABEL_CHARS
    assert head.traceparent == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert head.session == "s-1"
    assert headers_of(headers(("x-session", b"s-1"))).session == ""  # no session header configured


@pytest.mark.parametrize(("raw", "status"), [(b"200", 200), (b"503", 503), (b"\xd9\xa5\xd9\xa0\xd9\xa0", None),
                                             ("²".encode(), None), (b"9999", None), (b"099", None),
                                             (b"600", None), (b"\xff", None), (b"", None)])
def test_status_is_three_ascii_digits(raw: bytes, status: int | None) -> None:
    assert status_of(headers((":status", raw))) == status


def metadata(namespace: str, key: str, value: Any) -> pb.ProcessingRequest:
    msg = pb.ProcessingRequest()
    struct = struct_pb2.Struct()
    struct.update({key: value})
    msg.metadata_context.filter_metadata[namespace].CopyFrom(struct)
    return msg


def test_subset_hint_and_served_endpoint_are_bounded() -> None:
    hint = subset_hint(metadata("envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset",
                                ",".join(f"10.0.{i // 256}.{i % 256}:8000" for i in range(40_000))))
    assert hint is not None and 0 < len(hint) <= 16_384
    assert subset_hint(metadata("envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset",
                                ["x" * 10_000, FLEET[0]])) == {FLEET[0]}
    assert served_endpoint(metadata("envoy.lb", "x-gateway-destination-endpoint-served", "y" * 10_000)) is None


# ---- bodies ----

@pytest.mark.parametrize("body", [b"[" * 200_000, b"[" * 200_000 + b"]" * 200_000,
                                  b'{"prompt": ' + b"[" * 65 + b"]" * 65 + b"}",
                                  b'{"messages": [{"content": ' + b'{"a":' * 70 + b"1" + b"}" * 70 + b"}]}"])
def test_deep_nesting_is_a_400(body: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        parse_body("chat", body)
    assert info.value.reason == "nesting_too_deep" and str(MAX_NESTING_DEPTH) in info.value.message


def test_nesting_up_to_the_bound_and_brackets_in_strings_pass() -> None:
    at_bound = b'{"x": ' + b"[" * (MAX_NESTING_DEPTH - 1) + b"]" * (MAX_NESTING_DEPTH - 1) + b', "prompt": "hi"}'
    assert parse_body("completions", at_bound).prompt == "hi"
    brackets = json.dumps({"prompt": "[[[{{{" * 1000}).encode()  # brackets inside a string nest nothing
    assert parse_body("completions", brackets).prompt == "[[[{{{" * 1000


def test_past_a_count_bound_the_request_routes_on_load_alone() -> None:
    chat = json.dumps({"messages": [{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1)}).encode()
    assert parse_body("chat", chat).unscored == "too_many_messages"
    batch = json.dumps({"prompt": ["a"] * (MAX_BATCH_PROMPTS + 1)}).encode()
    assert parse_body("completions", batch).unscored == "too_many_prompts"
    ids = json.dumps({"prompt": [1] * (MAX_PROMPT_TOKEN_IDS + 1)}).encode()
    request = parse_body("completions", ids)
    assert request.unscored == "prompt_too_long" and not request.has_prompt
    within = parse_body("chat", json.dumps({"messages": [{"role": "user", "content": "hi"}] * MAX_MESSAGES}).encode())
    assert within.unscored is None and within.messages is not None


async def test_an_unscored_request_is_decided_on_load_with_its_reason() -> None:
    rig = make_rig(policy="leastload")
    ids = json.dumps({"prompt": [1] * (MAX_PROMPT_TOKEN_IDS + 1)}).encode()
    decision = await rig.decide(parse_body("completions", ids), "r")
    assert decision.endpoint in FLEET and decision.reasons == ("prompt_too_long",)


async def test_a_buffered_body_past_the_bound_gets_413_without_envoy() -> None:
    app = make("--max-request-body-bytes", "1024")
    sent = await converse_buffered(app, b'{"prompt": "' + b"x" * 2000 + b'"}')
    assert sent[-1].immediate_response.status.code == 413 and app.loads.total() == 0


async def converse_buffered(app: Sidecar, body: bytes) -> list[pb.ProcessingResponse]:
    feed = Recorder(buffered_messages(body))
    await app.extproc.process(None, feed)
    return feed.sent


# ---- failing helpers ----

class RaisingSource(FixedSource):
    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        self.calls += 1
        raise RuntimeError("the source's own bug")


class RaisingPolicy:
    name = "broken"
    needs = Needs()
    formula = "raises"

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate], mean_load: float | None = None
               ) -> Choice | None:
        raise ZeroDivisionError("policy bug")


class RaisingLoads:
    def loads(self, endpoints: tuple[str, ...]) -> list[float]:
        raise KeyError("loads bug")


async def test_a_prefix_source_raising_anything_degrades_to_load_only(caplog: pytest.LogCaptureFixture) -> None:
    rig = make_rig(source=RaisingSource())
    with caplog.at_level(logging.WARNING, logger="loadaware.routing.pipeline"):
        decisions = [await rig.decide(PROMPT, f"r{i}") for i in range(20)]
    assert all(d.endpoint in FLEET and d.outcome == "fallback_load_only" and "prefix_error" in d.reasons
               for d in decisions)
    assert rig.metrics.registry.get_sample_value("loadaware_fallbacks_total", {"reason": "prefix_error"}) == 20
    lines = [r for r in caplog.records if "prefix_error" in r.getMessage()]
    assert len(lines) <= 1 and all(r.exc_info is None for r in lines)  # rate-limited, no traceback


async def test_a_failing_policy_falls_back_to_the_least_loaded() -> None:
    rig = make_rig(policy="leastload")
    rig.decider.policy = RaisingPolicy()
    decisions = [await rig.decide(PROMPT, f"r{i}") for i in range(3)]  # none ends: each stays in flight
    assert all("policy_error" in d.reasons and d.outcome == "fallback_load_only" for d in decisions)
    # all idle: the lexically smallest; then the idle ones in turn
    assert [d.endpoint for d in decisions] == list(FLEET)
    assert [c.load for c in decisions[2].candidates] == [1, 1, 0]


async def test_failing_loads_and_health_still_decide() -> None:
    rig = make_rig(policy="leastload")
    rig.decider.data.loads = RaisingLoads()
    decision = await rig.decide(PROMPT, "r")
    assert decision.endpoint == min(FLEET) and "loads_error" in decision.reasons


def test_rate_limited_log_says_how_many_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    quiet = RateLimitedLog(logging.getLogger("t"), interval_s=10, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="t"):
        logged = [quiet.log(logging.WARNING, "k", "boom %s", i) for i in range(5)]
        now[0] = 11.0
        logged.append(quiet.log(logging.WARNING, "k", "boom %s", 5))
        logged.append(quiet.log(logging.WARNING, "other", "other"))
    assert logged == [True, False, False, False, False, True, True]
    assert [r.getMessage() for r in caplog.records] == [
        "boom 0", "boom 5 (and 4 more like it in the last 10 s)", "other"]


def test_a_failing_listener_is_counted_and_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    counted: list[str] = []

    class Broken:
        def on_decided(self, decision: Decision) -> None:
            raise ValueError("listener bug")

        def on_served(self, decision: Decision, previous: str | None) -> None: ...

        def on_ended(self, decision: Decision) -> None:
            raise ValueError("listener bug")

    seen: list[Decision] = []

    class Witness(Broken):
        def on_decided(self, decision: Decision) -> None:
            seen.append(decision)

        def on_ended(self, decision: Decision) -> None:
            pass

    class BrokenProgress:
        def on_first_chunk(self, decision: Decision) -> None:
            raise ValueError("progress listener bug")  # on the response path, once per request

    firsts: list[Decision] = []

    class ProgressWitness:
        def on_first_chunk(self, decision: Decision) -> None:
            firsts.append(decision)

    lifecycle = RequestLifecycle(on_failure=ListenerFailures(counted.append))
    lifecycle.subscribe(Broken())
    lifecycle.subscribe(Witness())
    lifecycle.subscribe_progress(BrokenProgress())
    lifecycle.subscribe_progress(ProgressWitness())
    with caplog.at_level(logging.WARNING, logger="loadaware.lifecycle"):
        for i in range(10):
            d = Decision(f"r{i}", FLEET[0], "routed", (), 0, (), (), {}, 0.0)
            lifecycle.decided(d)
            lifecycle.first_chunk(d)
            lifecycle.ended(d)
    assert len(seen) == 10 and len(firsts) == 10 and counted == ["listener_error"] * 30
    # one line per kind of failure per interval (decided, first_chunk, ended), never a traceback per request
    assert len(caplog.records) == 3 and all(r.levelno == logging.WARNING for r in caplog.records)


async def test_a_served_endpoint_outside_the_decision_is_not_believed() -> None:
    app = make()
    messages = duplex_messages(body_of(), chunks=0)
    with_metadata(messages[3], "envoy.lb", "x-gateway-destination-endpoint-served", "10.66.66.66:1")
    await converse(app, messages)
    decision = app.recent.items[-1]
    assert decision.endpoint in FLEET and decision.served == decision.endpoint and decision.status == 200
    responses = app.metrics.registry.get_sample_value
    assert responses("loadaware_responses_total", {"endpoint": "10.66.66.66:1", "code": "2xx"}) is None
    assert responses("loadaware_responses_total", {"endpoint": decision.endpoint, "code": "2xx"}) == 1
