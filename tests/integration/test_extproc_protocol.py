"""The ext_proc conversation, spoken directly to a real sidecar over gRPC (no Envoy in between)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from loadaware.app import Sidecar
from loadaware.config import from_args
from testkit.ports import free_port
from testkit.sidecar import SidecarProc
from tests.conftest import wait_until, wait_until_async

FLEET = "127.0.0.2:18000,127.0.0.3:18000"
# Long enough that "left when its last stream ended" and "left when the grace ran out" cannot be confused
# on a slow machine.
SHUTDOWN_GRACE_S = 30
HEADER = "x-gateway-destination-endpoint"


def headers(method: str, path: str, end: bool = False, spoof: str | None = None) -> pb.ProcessingRequest:
    hs = [(":method", method), (":path", path), ("x-request-id", "test-1")] + ([(HEADER, spoof)] if spoof else [])
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs]),
        end_of_stream=end))


def body(data: bytes) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=True))


@pytest.fixture
async def sidecar() -> AsyncIterator[tuple[Sidecar, str]]:
    port = free_port()
    app = Sidecar(from_args(["--listen", f"127.0.0.1:{port}", "--endpoints", FLEET, "--metrics-listen", "off",
                             "--admin-listen", "off", "--admin-http-listen", "off",  # no fixed default ports
                             "--policy", "leastload", "--shutdown-grace-s", "1"], environ={}))
    await app.start()
    yield app, f"127.0.0.1:{port}"
    await app.stop()


async def converse(addr: str, *messages: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
    async with grpc.aio.insecure_channel(addr) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        replies = []
        for msg in messages:
            await call.write(msg)
            replies.append(await call.read())
        await call.done_writing()
        return replies


def response_headers(status: str, served: str | None) -> pb.ProcessingRequest:
    """The response headers as envoy.yaml sends them: `:status`, and override_host's served-endpoint report in
    the forwarded `envoy.lb` namespace."""
    msg = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=":status", raw_value=status.encode())])))
    if served is not None:
        msg.metadata_context.filter_metadata["envoy.lb"].fields[
            "x-gateway-destination-endpoint-served"].string_value = served
    return msg


async def send_request(call: Any) -> list[str]:
    """A BUFFERED inference request's headers and body on an open stream; the ranked list the sidecar named."""
    await call.write(headers("POST", "/v1/completions"))
    await call.read()
    await call.write(body(b'{"prompt": "x"}'))
    reply = await call.read()
    return set_headers(reply.request_body.response.header_mutation)[HEADER].split(",")


def set_headers(mutation: pb.HeaderMutation) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


async def test_get_passes_through_and_skips_the_body(sidecar: tuple[Sidecar, str]) -> None:
    app, addr = sidecar
    (reply,) = await converse(addr, headers("GET", "/v1/models", end=True, spoof="127.0.0.3:18000"))
    assert reply.WhichOneof("response") == "request_headers"
    assert HEADER in reply.request_headers.response.header_mutation.remove_headers
    assert reply.mode_override.request_body_mode == processing_mode_pb2.ProcessingMode.NONE
    assert app.loads.total() == 0


async def test_post_is_decided_on_its_body(sidecar: tuple[Sidecar, str]) -> None:
    app, addr = sidecar
    r1, r2 = await converse(addr, headers("POST", "/v1/completions", spoof="127.0.0.3:18000"),
                            body(json.dumps({"prompt": "hi"}).encode()))
    assert HEADER in r1.request_headers.response.header_mutation.remove_headers  # the spoof is dropped first
    ranked = set_headers(r2.request_body.response.header_mutation)[HEADER].split(",")
    # the choice first, then the next best for the proxy's retries: here the whole two-engine fleet
    assert ranked[0] in FLEET.split(",") and sorted(ranked) == sorted(FLEET.split(","))
    # the same list as dynamic metadata, which override_host reads before the header
    assert r2.dynamic_metadata.fields["envoy.lb"].struct_value.fields[HEADER].string_value == ",".join(ranked)
    assert app.recent.items[-1].request_id == "test-1"
    # the stream ended: the count is released (the server sees the end asynchronously)
    await wait_until_async(lambda: app.loads.total() == 0, message="the in-flight count released")


async def test_bad_json_is_answered_locally(sidecar: tuple[Sidecar, str]) -> None:
    _, addr = sidecar
    _, r2 = await converse(addr, headers("POST", "/v1/chat/completions"), body(b"{nope"))
    assert r2.WhichOneof("response") == "immediate_response"
    assert r2.immediate_response.status.code == 400
    assert r2.immediate_response.body == b"request body is not valid JSON"


async def test_bodyless_post_is_decided_on_headers(sidecar: tuple[Sidecar, str]) -> None:
    app, addr = sidecar
    (reply,) = await converse(addr, headers("POST", "/v1/completions", end=True))
    assert set_headers(reply.request_headers.response.header_mutation)[HEADER].split(",")[0] in FLEET.split(",")
    assert app.recent.items[-1].reasons == ("no_prompt",)


async def test_open_stream_holds_its_count_until_it_ends(sidecar: tuple[Sidecar, str]) -> None:
    app, addr = sidecar
    async with grpc.aio.insecure_channel(addr) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        endpoint = (await send_request(call))[0]
        assert app.loads.count(endpoint) == 1  # the HTTP request is still running upstream
        call.cancel()  # Envoy resets the stream (client abort)
    await wait_until_async(lambda: app.loads.total() == 0, message="the reset stream's count released")


def test_sigterm_drains_open_streams(tmp_path: Path) -> None:
    port = free_port()
    proc = SidecarProc(["--listen", f"127.0.0.1:{port}", "--endpoints", FLEET, "--metrics-listen", "off",
                        "--policy", "leastload", "--shutdown-grace-s", str(SHUTDOWN_GRACE_S)], log_dir=tmp_path)
    proc._is_ready = lambda: True  # type: ignore[method-assign]  # no engines to scrape: not SERVING by design
    proc.start(timeout=20)
    try:
        _check_sigterm_drains_open_streams(proc, port)
    finally:
        proc.stop()


def _check_sigterm_drains_open_streams(proc: SidecarProc, port: int) -> None:
    def port_accepts() -> bool:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as probe:
            grpc.channel_ready_future(probe).result(timeout=0.5)
        return True

    # start() was told the sidecar is ready at once, so the port may not accept yet; it must, soon.
    wait_until(port_accepts, ignoring=(grpc.FutureTimeoutError,), timeout=20,
               message=f"the sidecar's gRPC port 127.0.0.1:{port} to accept connections")

    async def run() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            await call.write(headers("POST", "/v1/completions"))
            await call.read()
            await call.write(body(b'{"prompt": "x"}'))
            await call.read()
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGTERM)
            await wait_until_async(lambda: "draining 1 open streams" in proc.log_tail(20),
                                   message="the sidecar to start draining after SIGTERM")
            # the open stream is still served during the grace period...
            assert proc.running

            # ...and new streams are refused (the server stops taking them right after logging the drain)
            async def new_stream_is_refused() -> bool:
                other = pb_grpc.ExternalProcessorStub(channel).Process()
                try:
                    await other.write(headers("GET", "/x", end=True))
                    await asyncio.wait_for(other.read(), 2)
                except grpc.aio.AioRpcError:
                    return True
                await other.done_writing()
                return False

            await wait_until_async(new_stream_is_refused, message="a new stream refused while draining")
            await call.done_writing()

    asyncio.run(run())
    # It leaves as soon as its last stream ends: long before the grace would run out.
    wait_until(lambda: not proc.running, timeout=SHUTDOWN_GRACE_S / 2,
               message=f"the sidecar to exit once its last stream ended (grace {SHUTDOWN_GRACE_S} s)")
    log = proc.log_tail(20)
    assert "draining 1 open streams" in log
    assert "released 0 in-flight counts" in log  # the stream's own end released it, before shutdown



async def routed_with_response(addr: str, respond: Callable[[list[str]], pb.ProcessingRequest | None],
                               app: Sidecar, while_open: Callable[[list[str]], None] = lambda _: None
                               ) -> list[str]:
    """One BUFFERED request: headers, body, then (if `respond` gives one) the response headers for its ranked
    list; `while_open` looks at the sidecar before the stream ends. Returns the ranked list."""
    async with grpc.aio.insecure_channel(addr) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        ranked = await send_request(call)
        response = respond(ranked)
        if response is not None:
            await call.write(response)
            assert (await call.read()).WhichOneof("response") == "response_headers"
        while_open(ranked)
        await call.done_writing()
    await wait_until_async(lambda: app.loads.total() == 0, message="the count released")
    return ranked


async def test_response_headers_report_each_requests_outcome(sidecar: tuple[Sidecar, str]) -> None:
    """BUFFERED mode (envoy.yaml sends the response headers): the status and the engine that served feed
    failure-aware routing; a retry that walked past the choice moves the count there."""
    app, addr = sidecar
    victim, other = FLEET.split(",")

    def count_moved(ranked: list[str]) -> None:
        assert app.loads.count(ranked[1]) == 1 and app.loads.count(ranked[0]) == 0

    # Envoy's retry moved the request from the choice to the other engine, which answered 200.
    ranked = await routed_with_response(addr, lambda r: response_headers("200", r[1]), app, count_moved)
    passed = ranked[0]
    assert app.endpoint_health.view(passed).failures == {"passed_over": 1}
    assert app.endpoint_health.view(ranked[1]).successes == 1

    def fail_victim(ranked: list[str]) -> pb.ProcessingRequest:
        return response_headers("500" if ranked[0] == victim else "200", ranked[0])

    for _ in range(12):  # leastload alternates on an idle fleet; --eject-after-failures is 3
        await routed_with_response(addr, fail_victim, app)
        if app.endpoint_health.state(victim) == "ejected":
            break
    view = app.endpoint_health.view(victim)
    assert view.state == "ejected" and view.reason == "http_5xx" and view.failures.get("http_5xx", 0) >= 2
    # Out of rotation: the next decisions name only the other engine, and its 4xx answers are no failures.
    for _ in range(3):
        ranked = await routed_with_response(addr, lambda r: response_headers("404", r[0]), app)
        assert ranked == [other]
    assert app.endpoint_health.state(other) == "healthy"
