"""The ext_proc fuzzer (testkit/extproc_fuzz.py) inside the normal run: random conversations in both modes,
in process and over real gRPC on loopback. No stream error, no leaked in-flight count, the sidecar still
deciding afterwards. 2,700 cases: 600 chosen by hypothesis in process and 100 over gRPC (it shrinks what
fails), 2,000 by the seeded random source through the same case builder (hypothesis spends ~20x longer
choosing a case than the sidecar running it). `make bench BENCH_ARGS="--cases fuzz"` runs 100,000."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import HealthCheck, given, settings

from loadaware.extproc.stream import METHOD, SERVICE_NAME
from testkit.extproc_fuzz import (
    FLEET,
    Case,
    FuzzRig,
    a_normal_request_decides,
    body_message,
    cases,
    fuzz_sidecar,
    random_case,
)

IN_PROCESS_CASES = 600
OVER_GRPC_CASES = 100
RANDOM_CASES = 2000
RANDOM_SEED = 1  # the bench runs seed 0: the unit run covers other cases


def fuzz(cases_run: int) -> settings:
    return settings(max_examples=cases_run, deadline=None, database=None, suppress_health_check=list(HealthCheck),
                    print_blob=True)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def rig(loop: asyncio.AbstractEventLoop) -> Iterator[FuzzRig]:
    async def build() -> FuzzRig:
        return FuzzRig(fuzz_sidecar())

    rig = loop.run_until_complete(build())
    yield rig
    loop.run_until_complete(rig.app.state_probe.close())
    rig.close_logging()
    if rig.app.tokenizer is not None:
        rig.app.tokenizer.close()


def test_in_process_conversations_keep_every_invariant(rig: FuzzRig, loop: asyncio.AbstractEventLoop) -> None:
    ran = {"buffered": 0, "full_duplex": 0}

    @fuzz(IN_PROCESS_CASES)
    @given(case=cases())
    def one(case: Case) -> None:
        ran["full_duplex" if case.duplex else "buffered"] += 1
        assert loop.run_until_complete(rig.check_case(case)) == []

    one()
    assert sum(ran.values()) >= IN_PROCESS_CASES and min(ran.values()) > IN_PROCESS_CASES // 4
    for i in range(RANDOM_CASES):  # case i is replayed by random_case(Random(RANDOM_SEED * 10**9 + i))
        case = random_case(random.Random(RANDOM_SEED * 10**9 + i))
        ran["full_duplex" if case.duplex else "buffered"] += 1
        assert loop.run_until_complete(rig.check_case(case)) == [], f"random case {i}: {case!r}"
    assert min(ran.values()) > (IN_PROCESS_CASES + RANDOM_CASES) // 4
    assert rig.app.loads.total() == 0 and rig.stream_errors() == 0
    decision = loop.run_until_complete(a_normal_request_decides(rig.app))
    assert decision is not None and decision.endpoint in FLEET and decision.ended
    assert rig.app.extproc.modes["buffered"] > 0 and rig.app.extproc.modes["full_duplex"] > 0


def test_conversations_over_real_grpc_keep_every_invariant(rig: FuzzRig, loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(rig.start_grpc())
    try:
        @fuzz(OVER_GRPC_CASES)
        @given(case=cases())
        def one(case: Case) -> None:
            assert loop.run_until_complete(rig.check_case(case, over_grpc=True)) == []

        one()
        assert rig.app.loads.total() == 0 and rig.stream_errors() == 0
        decision = loop.run_until_complete(a_normal_request_decides(rig.app))
        assert decision is not None and decision.endpoint in FLEET
    finally:
        loop.run_until_complete(rig.stop_grpc())


def test_the_known_leak_headers_end_then_a_body_anyway(rig: FuzzRig, loop: asyncio.AbstractEventLoop) -> None:
    """BUFFERED: request headers with end_of_stream, then a body anyway: one decision, released once."""
    headers = pb.ProcessingRequest()
    headers.request_headers.CopyFrom(
        pb.HttpHeaders(end_of_stream=True, headers=_headers(b"POST", b"/v1/completions", b"abc\xffdef")))
    body = body_message("request_body", b'{"prompt": "hi"}', True)
    for messages in ([headers, body], [headers, body, body], [headers, headers, body]):
        assert loop.run_until_complete(rig.check_case(Case(False, list(messages), None))) == []
    assert rig.app.loads.total() == 0


def _headers(method: bytes, path: bytes, request_id: bytes) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":method", raw_value=method),
                                       base_pb2.HeaderValue(key=":path", raw_value=path),
                                       base_pb2.HeaderValue(key="x-request-id", raw_value=request_id)])


def test_a_message_that_is_not_a_processing_request_ends_the_stream_quietly(
        rig: FuzzRig, loop: asyncio.AbstractEventLoop) -> None:
    async def send_garbage() -> None:
        await rig.start_grpc()
        try:
            assert rig.channel is not None
            call = rig.channel.stream_stream(f"/{SERVICE_NAME}/{METHOD}", request_serializer=None,
                                             response_deserializer=None)()
            await call.write(b"\xff\xff\xff\xff not protobuf")
            await call.done_writing()
            with contextlib.suppress(grpc.aio.AioRpcError):
                async for _ in call:
                    pass
            assert await rig.servicer_done()
        finally:
            await rig.stop_grpc()

    logged = len(rig.errors.records)
    loop.run_until_complete(send_garbage())
    malformed = rig.app.metrics.registry.get_sample_value("loadaware_extproc_streams_total", {"end": "malformed"})
    assert malformed == 1 and rig.stream_errors() == 0 and len(rig.errors.records) == logged
    assert rig.app.loads.total() == 0
