"""Stored responses reach their holder, spoken directly to a real sidecar over gRPC (no Envoy in between).

Two small HTTP servers stand in for the engines' `GET /v1/responses/{id}` (what the sidecar asks for an id it does
not know). The Envoy round trips are in tests/e2e/test_agentic_envoy.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from aiohttp import web
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from loadaware.app import Sidecar
from loadaware.config import from_args
from loadaware.extproc.replies import PINNED_REPEATS
from testkit.paths import TINY_TOKENIZER
from testkit.ports import free_port
from tests.conftest import wait_until_async
from tests.integration.test_extproc_protocol import HEADER, body, headers, response_headers, set_headers

Mode = processing_mode_pb2.ProcessingMode


class StateEngines:
    """Two engines that answer GET /v1/responses/{id}: 200 for the ids they hold, 404 for the rest."""

    def __init__(self) -> None:
        self.held: dict[str, set[str]] = {}
        self.asked: list[tuple[str, str]] = []
        self.runners: list[web.AppRunner] = []
        self.endpoints: list[str] = []

    async def start(self, n: int = 2) -> None:
        for _ in range(n):
            port = free_port()
            endpoint = f"127.0.0.1:{port}"
            app = web.Application()
            app.router.add_get("/v1/responses/{rid}", self._handler(endpoint))
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.runners.append(runner)
            self.endpoints.append(endpoint)
            self.held[endpoint] = set()

    def _handler(self, endpoint: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            rid = request.match_info["rid"]
            self.asked.append((endpoint, rid))
            if rid in self.held[endpoint]:
                return web.json_response({"id": rid, "object": "response"})
            return web.json_response({"error": {"message": f"Response with id '{rid}' not found."}}, status=404)
        return handle

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[Sidecar, str, StateEngines]]:
    engines = StateEngines()
    await engines.start()
    port = free_port()
    app = Sidecar(from_args(["--listen", f"127.0.0.1:{port}", "--endpoints", ",".join(engines.endpoints),
                             "--metrics-listen", "off", "--admin-listen", "off", "--admin-http-listen", "off",
                             "--tokenizer", str(TINY_TOKENIZER),
                             "--shutdown-grace-s", "1"], environ={}))
    await app.start()
    yield app, f"127.0.0.1:{port}", engines
    await app.stop()
    await engines.stop()


def response_body(data: bytes, end: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=end))


async def first_turn(addr: str, reply_chunks: list[bytes], served: str | None = None
                     ) -> tuple[str, pb.ProcessingResponse]:
    """A stored Responses turn through BUFFERED mode: the choice, and the reply to its response headers."""
    async with grpc.aio.insecure_channel(addr) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(headers("POST", "/v1/responses"))
        await call.read()
        await call.write(body(json.dumps({"model": "m", "input": "hello there", "store": True}).encode()))
        choice = set_headers((await call.read()).request_body.response.header_mutation)[HEADER].split(",")[0]
        await call.write(response_headers("200", served or choice))
        reply = await call.read()
        for i, chunk in enumerate(reply_chunks):
            await call.write(response_body(chunk, end=i == len(reply_chunks) - 1))
            assert (await call.read()).WhichOneof("response") == "response_body"
        await call.done_writing()
    return choice, reply


async def follow_up(addr: str, previous: str) -> tuple[list[str], pb.ProcessingResponse]:
    async with grpc.aio.insecure_channel(addr) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(headers("POST", "/v1/responses"))
        await call.read()
        await call.write(body(json.dumps({"model": "m", "input": "and then?",
                                          "previous_response_id": previous}).encode()))
        ranked = set_headers((await call.read()).request_body.response.header_mutation)[HEADER].split(",")
        await call.write(response_headers("200", ranked[0]))
        reply = await call.read()
        await call.done_writing()
    return ranked, reply


async def test_the_holder_is_learned_from_the_response_and_beats_load(
        fleet: tuple[Sidecar, str, StateEngines]) -> None:
    app, addr, engines = fleet
    # The id arrives split across chunks, as a stream's first event may be.
    choice, reply = await first_turn(addr, [b'{"id": "resp_ab', b'c123", "object": "response", "output": []}'])
    # Only this request's response body was asked for: streamed by, never buffered.
    assert reply.mode_override.response_body_mode == Mode.STREAMED
    assert app.state_holders.known("resp_abc123") == choice
    # Requests held open on the holder only: it is the busier engine by far.
    other = next(ep for ep in engines.endpoints if ep != choice)
    async with grpc.aio.insecure_channel(addr) as channel:
        calls: list[Any] = []
        others: list[Any] = []
        for _ in range(6):  # they alternate: then the other engine's are ended
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            await call.write(headers("POST", "/v1/completions", end=True))
            ranked_now = set_headers((await call.read()).request_headers.response.header_mutation)[HEADER]
            (calls if ranked_now.startswith(choice) else others).append(call)
        for call in others:
            call.cancel()
        await wait_until_async(lambda: app.loads.count(other) == 0, message="the other engine's requests ended")
        assert app.loads.count(choice) >= 3
        ranked, reply = await follow_up(addr, "resp_abc123")
        for call in calls:
            call.cancel()
    # The holder alone, once per attempt the proxy may make: a retry elsewhere could only find no such response.
    assert ranked == [choice] * PINNED_REPEATS
    decision = app.recent.items[-1]
    assert decision.state == "known" and decision.rule == "state" and decision.pinned
    assert decision.ranked == (choice,)
    assert decision.prompt_tokens > 0  # its own input still tokenized as the engine renders it
    assert not engines.asked  # a known holder: no engine asked
    # A follow-up's own response (a new stored response) is read too.
    assert reply.mode_override.response_body_mode == Mode.STREAMED


async def test_a_stored_responses_own_paths_go_to_its_holder(fleet: tuple[Sidecar, str, StateEngines]) -> None:
    app, addr, engines = fleet
    app.state_holders.learn("resp_known", engines.endpoints[1])
    async with grpc.aio.insecure_channel(addr) as channel:
        for method, path in (("GET", "/v1/responses/resp_known"), ("POST", "/v1/responses/resp_known/cancel")):
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            await call.write(headers(method, path, end=True))
            reply = await call.read()
            assert set_headers(reply.request_headers.response.header_mutation)[HEADER] == ",".join(
                [engines.endpoints[1]] * PINNED_REPEATS)
            assert app.recent.items[-1].state == "known" and app.recent.items[-1].reasons == ()
            call.cancel()


async def test_an_unknown_id_is_found_by_asking_the_engines_once(fleet: tuple[Sidecar, str, StateEngines]) -> None:
    """Another gateway replica made it (or this sidecar restarted): the engines are asked, the holder answers 200,
    and the answer is kept."""
    app, addr, engines = fleet
    holder = engines.endpoints[0]
    engines.held[holder].add("resp_elsewhere")
    ranked, _ = await follow_up(addr, "resp_elsewhere")
    assert ranked == [holder] * PINNED_REPEATS and app.recent.items[-1].state == "probed"
    asked = len(engines.asked)
    assert asked == len(engines.endpoints) or (asked >= 1 and engines.asked[0][0] == holder)
    ranked, _ = await follow_up(addr, "resp_elsewhere")
    assert ranked == [holder] * PINNED_REPEATS and app.recent.items[-1].state == "known"
    assert len(engines.asked) == asked  # remembered: nobody asked again


async def test_an_id_nobody_holds_is_routed_as_any_request(fleet: tuple[Sidecar, str, StateEngines]) -> None:
    """No engine holds it: the request goes where the policy says, with its fallbacks, and the engine answers its
    own 404 (the sidecar invents no answer). A burst for the same lost id asks the engines once."""
    app, addr, engines = fleet
    ranked, _ = await follow_up(addr, "resp_lost")
    assert sorted(ranked) == sorted(engines.endpoints)
    assert app.recent.items[-1].state == "not_found" and app.recent.items[-1].rule != "state"
    asked = len(engines.asked)
    await follow_up(addr, "resp_lost")
    assert len(engines.asked) == asked


async def test_other_responses_bodies_are_never_asked_for(fleet: tuple[Sidecar, str, StateEngines]) -> None:
    _, addr, _ = fleet
    for path, payload in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                          ("/v1/responses", {"input": "hi", "store": False}),
                          ("/v1/responses", {"input": "hi", "stream": True}),  # BUFFERED: an event stream
                          ("/v1/messages", {"model": "m", "max_tokens": 8,
                                            "messages": [{"role": "user", "content": "hi"}]})):
        async with grpc.aio.insecure_channel(addr) as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            await call.write(headers("POST", path))
            await call.read()
            await call.write(body(json.dumps(payload).encode()))
            ranked = set_headers((await call.read()).request_body.response.header_mutation)[HEADER].split(",")
            await call.write(response_headers("200", ranked[0]))
            reply = await call.read()
            await call.done_writing()
        assert not reply.HasField("mode_override"), path


async def test_messages_are_decided_by_their_rendered_prompt(fleet: tuple[Sidecar, str, StateEngines]) -> None:
    app, addr, _ = fleet
    system = "You are a careful assistant. " * 40
    payload = {"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": system}],
               "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    async with grpc.aio.insecure_channel(addr) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(headers("POST", "/v1/messages"))
        await call.read()
        await call.write(body(json.dumps(payload).encode()))
        await call.read()
        call.cancel()
    decision = app.recent.items[-1]
    chat = [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]
    assert app.tokenizer is not None
    assert decision.prompt_tokens == len(await app.tokenizer.encode_chat(chat)) and decision.reasons == ()


async def test_a_bad_responses_body_gets_a_400(fleet: tuple[Sidecar, str, StateEngines]) -> None:
    _, addr, _ = fleet
    for payload in ({"input": 5}, {"input": [{"type": "mystery"}]}, {"input": "x", "previous_response_id": 7}):
        async with grpc.aio.insecure_channel(addr) as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            await call.write(headers("POST", "/v1/responses"))
            await call.read()
            await call.write(body(json.dumps(payload).encode()))
            reply = await call.read()
            call.cancel()
        assert reply.immediate_response.status.code == 400, payload


def duplex_headers(method: str, path: str, end: bool = False) -> pb.ProcessingRequest:
    msg = headers(method, path, end)
    msg.protocol_config.request_body_mode = Mode.FULL_DUPLEX_STREAMED
    msg.protocol_config.response_body_mode = Mode.FULL_DUPLEX_STREAMED
    return msg


async def test_the_picker_learns_from_the_response_it_streams(fleet: tuple[Sidecar, str, StateEngines]) -> None:
    """FULL_DUPLEX_STREAMED (the InferencePool picker): the response streams through the picker anyway; the id of
    a stored response is read from its first event."""
    app, addr, _ = fleet
    event = b'event: response.created\ndata: {"response": {"id": "resp_dup1", "object": "response"}, ' \
            b'"type": "response.created"}\n\n'
    async with grpc.aio.insecure_channel(addr) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(duplex_headers("POST", "/v1/responses"))
        await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(
            body=json.dumps({"model": "m", "input": "hi", "stream": True}).encode(), end_of_stream=True)))
        route = await call.read()
        choice = set_headers(route.request_headers.response.header_mutation)[HEADER].split(",")[0]
        await call.read()  # the body, back
        await call.write(response_headers("200", choice))
        await call.read()
        await call.write(response_body(event))
        echoed = await call.read()
        assert echoed.response_body.response.body_mutation.streamed_response.body == event
        call.cancel()
    assert app.state_holders.known("resp_dup1") == choice
    async with grpc.aio.insecure_channel(addr) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(duplex_headers("GET", "/v1/responses/resp_dup1", end=True))
        reply = await call.read()
        call.cancel()
    assert set_headers(reply.request_headers.response.header_mutation)[HEADER] == ",".join([choice] * PINNED_REPEATS)
