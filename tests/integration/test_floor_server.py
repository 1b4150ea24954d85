"""The transport-floor stand-in (bench/floor_server.py) speaks the BUFFERED protocol as envoy.yaml expects it,
in each server variant: a benchmark of a server that answers wrongly would measure nothing."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from bench.transport_floor import FloorProc
from testkit.ports import free_port
from tests.integration.test_extproc_protocol import body, headers, response_headers, set_headers

ENGINES = ["127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000"]
HEADER = "x-gateway-destination-endpoint"


@pytest.mark.parametrize(("server", "processes"), [("aio", 1), ("sync", 1), ("aio", 2), ("grpclib", 1)])
async def test_floor_server_answers_every_buffered_message(tmp_path: Path, server: str, processes: int) -> None:
    port = free_port()
    with FloorProc(port, ENGINES, server, processes, tmp_path) as proc:
        firsts = []
        for _ in range(6):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = pb_grpc.ExternalProcessorStub(channel).Process()
                await call.write(headers("POST", "/v1/completions"))
                assert (await call.read()).WhichOneof("response") == "request_headers"
                await call.write(body(b'{"prompt": "x"}'))
                routed = await call.read()
                ranked = set_headers(routed.request_body.response.header_mutation)[HEADER].split(",")
                lb = routed.dynamic_metadata.fields["envoy.lb"].struct_value.fields[HEADER].string_value
                assert sorted(ranked) == ENGINES and lb == ",".join(ranked)
                await call.write(response_headers("200", ranked[0]))
                assert (await call.read()).WhichOneof("response") == "response_headers"
                await call.done_writing()
            firsts.append(ranked[0])
        if processes == 1:  # one process: round robin over the engines
            assert firsts == [*ENGINES, *ENGINES]
        assert proc.cpu_seconds() > 0
