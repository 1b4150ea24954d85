"""--max-open-streams: past the cap a new request is refused at its headers with a 503 and Retry-After, in both
processing modes; the open ones are untouched, and a stream that ends makes room again."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from loadaware.app import Sidecar
from loadaware.config import from_args
from loadaware.extproc.stream import over_cap
from testkit.ports import free_port
from tests.conftest import wait_until_async
from tests.integration.test_extproc_protocol import FLEET, HEADER, body, headers, send_request, set_headers

CAP = 3


@pytest.fixture
async def capped() -> AsyncIterator[tuple[Sidecar, str]]:
    port = free_port()
    app = Sidecar(from_args(["--listen", f"127.0.0.1:{port}", "--endpoints", FLEET, "--metrics-listen", "off",
                             "--admin-listen", "off", "--admin-http-listen", "off", "--policy", "leastload",
                             "--shutdown-grace-s", "1", "--max-open-streams", str(CAP)], environ={}))
    await app.start()
    yield app, f"127.0.0.1:{port}"
    await app.stop()


def reply_headers(reply: pb.ProcessingResponse) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in reply.immediate_response.headers.set_headers}


def duplex_headers() -> pb.ProcessingRequest:
    msg = headers("POST", "/v1/completions")
    msg.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    return msg


async def first_reply(channel: grpc.aio.Channel, msg: pb.ProcessingRequest) -> tuple[Any, pb.ProcessingResponse]:
    call = pb_grpc.ExternalProcessorStub(channel).Process()
    await call.write(msg)
    return call, await call.read()


async def test_past_the_cap_a_request_gets_503_and_the_open_ones_go_on(capped: tuple[Sidecar, str]) -> None:
    app, addr = capped
    async with grpc.aio.insecure_channel(addr) as channel:
        held = [pb_grpc.ExternalProcessorStub(channel).Process() for _ in range(CAP)]
        for call in held:  # CAP requests routed and still running upstream
            assert (await send_request(call))[0] in FLEET.split(",")
        assert app.loads.total() == CAP and app.extproc.open_streams == CAP

        _, refused = await first_reply(channel, headers("POST", "/v1/completions"))
        assert refused.immediate_response.status.code == 503
        assert reply_headers(refused)["retry-after"] == "1"
        assert reply_headers(refused)["x-loadaware-request-dropped-reason"] == "too_many_open_streams"
        assert refused.immediate_response.headers.set_headers[0].header.raw_value == b"text/plain"

        _, refused = await first_reply(channel, duplex_headers())  # a picker's stream: its JSON body
        assert refused.immediate_response.status.code == 503
        assert json.loads(refused.immediate_response.body)["error"]["code"] == 503
        assert app.loads.total() == CAP  # nothing was counted for the refused ones

        held[0].cancel()  # one request ends: room for one more
        await wait_until_async(lambda: app.extproc.open_streams <= CAP, message="the refused and ended streams closed")
        call, reply = await first_reply(channel, headers("POST", "/v1/completions"))
        assert reply.WhichOneof("response") == "request_headers"
        await call.write(body(b'{"prompt": "x"}'))
        routed = await call.read()
        assert set_headers(routed.request_body.response.header_mutation)[HEADER].split(",")[0] in FLEET.split(",")
        for c in (*held[1:], call):
            c.cancel()
    await wait_until_async(lambda: app.loads.total() == 0, message="every count released")
    counts = {s.labels.get("outcome"): s.value for m in app.metrics.registry.collect() if m.name ==
              "loadaware_decisions" for s in m.samples if s.name.endswith("_total")}
    assert counts.get("overloaded") == 2


def test_the_streams_admission_holds_do_not_count_against_the_cap() -> None:
    """Held requests have admission's own bounds; counting them would let a pile of held lower-band requests
    refuse a top-band request with a 503 before admission could serve it first."""
    assert not over_cap(open_streams=3, held=0, cap=3)
    assert over_cap(open_streams=4, held=0, cap=3)
    assert not over_cap(open_streams=3 + 100, held=100, cap=3)
    assert over_cap(open_streams=4 + 100, held=100, cap=3)
    assert not over_cap(open_streams=10**6, held=0, cap=0)  # 0: no cap
