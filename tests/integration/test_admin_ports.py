"""Each port serves only its own, in a real sidecar over real sockets (no Envoy in between):

- the ext_proc port (--listen): ext_proc and grpc.health.v1; the debug API and reflection are refused;
- the admin port (--admin-listen, loopback): loadaware.v1.Router, reflection (listing exactly what it serves)
  and health; no ext_proc;
- the metrics port (--metrics-listen): /metrics only; the admin HTTP port (--admin-http-listen): /debug only.

And the tenant-safety promise: a prefix-cache-aware router can tell whether a prompt was recently served
(that is why Explain lives on the admin port), but neither Explain nor /debug/decisions nor /debug/state ever
shows a prompt's text or its token ids, for a routed request or an explained one.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from google.protobuf import json_format, struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from loadaware.api.v1 import loadaware_pb2 as pb
from loadaware.api.v1 import loadaware_pb2_grpc as pb_grpc
from loadaware.app import Sidecar
from loadaware.config import from_args
from sim.tokenization import SimTokenizer
from testkit.paths import TINY_TOKENIZER
from testkit.ports import free_port
from tests.conftest import wait_until_async
from tests.prompt_leaks import assert_no_prompt

FLEET = "127.0.0.2:18000,127.0.0.3:18000,127.0.0.4:18000"
HEADER = "x-gateway-destination-endpoint"
ROUTER_METHODS = ("Explain", "ListEndpoints", "GetConfig")

# A prompt nobody else would write, long enough for several prefix blocks.
SECRET = "Zephyrine-4471 smuggled quokka marmalade across Lake Titicaca at dawn"
WORDS = ("zephyrine", "4471", "quokka", "marmalade", "titicaca", SECRET)
PROMPT = " ".join(f"{SECRET} (note {i})." for i in range(12))


@dataclass
class Ports:
    app: Sidecar
    extproc: str
    admin: str
    metrics: str
    debug: str


def addr() -> str:
    return f"127.0.0.1:{free_port()}"


async def serve(*flags: str) -> Sidecar:
    app = Sidecar(from_args(["--endpoints", FLEET, "--tokenizer", str(TINY_TOKENIZER), "--prefix-source", "approx",
                             "--policy", "loadaware", "--shutdown-grace-s", "1", *flags], environ={}))
    await app.start()
    return app


@pytest.fixture
async def ports() -> AsyncIterator[Ports]:
    extproc, admin, metrics, debug = addr(), addr(), addr(), addr()
    app = await serve("--listen", extproc, "--admin-listen", admin, "--metrics-listen", metrics,
                      "--admin-http-listen", debug)
    try:
        yield Ports(app, extproc, admin, metrics, debug)
    finally:
        await app.stop()


async def unary(address: str, method: str, request: bytes = b"") -> bytes:
    async with grpc.aio.insecure_channel(address) as channel:
        return bytes(await channel.unary_unary(method)(request, timeout=5))


async def code_of(address: str, method: str) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await unary(address, method)
    return error.value.code()


async def reflected_services(address: str) -> list[str]:
    async with grpc.aio.insecure_channel(address) as channel:
        call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(timeout=5)
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        reply = await call.read()
        await call.done_writing()
    return sorted(s.name for s in reply.list_services_response.service)


async def health(address: str, service: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                                timeout=5)
    return int(reply.status)


async def http_get(address: str, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(f"http://{address}{path}") as resp:
        return resp.status, await resp.text()


def request_headers(path: str, request_id: str) -> ext_pb.ProcessingRequest:
    hs = [(":method", "POST"), (":path", path), ("x-request-id", request_id)]
    return ext_pb.ProcessingRequest(request_headers=ext_pb.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs])))


async def route(address: str, path: str, body: dict[str, Any], request_id: str) -> str:
    """One BUFFERED ext_proc conversation, as Envoy holds it: headers, then the whole body; the choice."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = ext_grpc.ExternalProcessorStub(channel).Process()
        await call.write(request_headers(path, request_id))
        await call.read()
        await call.write(ext_pb.ProcessingRequest(request_body=ext_pb.HttpBody(body=json.dumps(body).encode(),
                                                                               end_of_stream=True)))
        reply = await call.read()
        await call.done_writing()
    mutation = reply.request_body.response.header_mutation
    ranked = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}[HEADER]
    return ranked.split(",")[0]


def struct(body: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(body)
    return s


# ---- each port serves only its own -------------------------------------------------------------------------

async def test_the_ext_proc_port_serves_ext_proc_and_health_only(ports: Ports) -> None:
    for method in ROUTER_METHODS:
        assert await code_of(ports.extproc, f"/loadaware.v1.Router/{method}") == grpc.StatusCode.UNIMPLEMENTED
    # one unary batch, as the admin port's refusal below: a streamed write racing a refusal can report INTERNAL
    listing = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
    with pytest.raises(grpc.aio.AioRpcError) as no_reflection:
        await unary(ports.extproc, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", listing)
    assert no_reflection.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert await health(ports.extproc, "liveness") == health_pb2.HealthCheckResponse.SERVING
    chosen = await route(ports.extproc, "/v1/completions", {"prompt": "hello"}, "req-ext")
    assert chosen in FLEET.split(",")


async def test_the_admin_port_serves_the_debug_api_reflection_and_health(ports: Ports) -> None:
    assert await reflected_services(ports.admin) == [
        "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection", "loadaware.v1.Router"]
    async with grpc.aio.insecure_channel(ports.admin) as channel:
        stub = pb_grpc.RouterStub(channel)
        config = {s.name: s for s in (await stub.GetConfig(pb.GetConfigRequest(), timeout=5)).settings}
        assert config["admin_listen"].value.string_value == ports.admin
        assert config["admin_listen"].origin == "flag"
        listed = await stub.ListEndpoints(pb.ListEndpointsRequest(), timeout=5)
        assert sorted(e.endpoint for e in listed.endpoints) == sorted(FLEET.split(","))
    # the same health answers as the ext_proc port (one reporter)
    assert await health(ports.admin, "liveness") == health_pb2.HealthCheckResponse.SERVING
    assert await health(ports.admin, "readiness") == await health(ports.extproc, "readiness")
    # no ext_proc there: the admin port is no way into routing
    # Asked as one unary batch (the stream's first message, then the status): a streamed write racing the refusal
    # set the call's own status to INTERNAL "Failed execute_batch" in grpcio's client (twice in CI runs), while a
    # batch that asks for the status reports the server's.
    first = request_headers("/v1/completions", "req-admin").SerializeToString()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await unary(ports.admin, "/envoy.service.ext_proc.v3.ExternalProcessor/Process", first)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert ports.app.admin_port == int(ports.admin.rpartition(":")[2])


async def test_metrics_port_has_metrics_only_and_the_admin_http_port_debug_only(ports: Ports) -> None:
    status, text = await http_get(ports.metrics, "/metrics")
    assert status == 200 and "loadaware_decisions_total" in text
    for path in ("/debug/decisions", "/debug/state", "/debug/state?x=1"):
        assert (await http_get(ports.metrics, path))[0] == 404
        assert (await http_get(ports.debug, path))[0] == 200
    assert (await http_get(ports.debug, "/metrics"))[0] == 404


async def test_admin_listeners_can_be_turned_off() -> None:
    extproc = addr()
    app = await serve("--listen", extproc, "--metrics-listen", "off", "--admin-listen", "off",
                      "--admin-http-listen", "off")
    try:
        assert app.admin_server is None and app.admin_port is None and app.debug_http.runner is None
        assert await health(extproc, "liveness") == health_pb2.HealthCheckResponse.SERVING
        assert await code_of(extproc, "/loadaware.v1.Router/GetConfig") == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await app.stop()


@pytest.fixture
def taken() -> Iterator[str]:
    """An address something else already listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("flag", ["--listen", "--health-listen", "--admin-listen", "--admin-http-listen"])
async def test_a_taken_address_is_refused_at_start_naming_the_flag(flag: str, taken: str) -> None:
    app = Sidecar(from_args(["--endpoints", FLEET, "--listen", addr(), "--metrics-listen", "off",
                             "--admin-listen", addr(), "--admin-http-listen", addr(), flag, taken], environ={}))
    try:
        with pytest.raises(OSError, match=f"^{flag}: cannot bind {taken}"):
            await app.start()
    finally:
        await app.stop()


# ---- no prompt text, no token ids, anywhere an operator looks ----------------------------------------------

async def test_explain_and_the_debug_pages_never_show_a_prompt(ports: Ports) -> None:
    tok = SimTokenizer(TINY_TOKENIZER)
    token_ids = tok.encode_prompt(PROMPT)
    messages = [{"role": "system", "content": PROMPT}, {"role": "user", "content": f"What did {SECRET}?"}]
    chat_ids = tok.encode_chat(messages)
    assert len(token_ids) > 100 and len(chat_ids) > 100
    # routed requests, as Envoy sends them to the ext_proc port: completions and chat
    served = await route(ports.extproc, "/v1/completions", {"model": "m", "prompt": PROMPT}, "req-secret-1")
    await route(ports.extproc, "/v1/chat/completions", {"model": "m", "messages": messages}, "req-secret-2")
    await wait_until_async(lambda: ports.app.loads.total() == 0, message="both requests ended")
    replies: list[pb.ExplainResponse] = []
    async with grpc.aio.insecure_channel(ports.admin) as channel:
        stub = pb_grpc.RouterStub(channel)
        for request in (
            pb.ExplainRequest(body=struct({"model": "m", "prompt": PROMPT})),
            pb.ExplainRequest(path="/v1/chat/completions", body=struct({"model": "m", "messages": messages})),
            pb.ExplainRequest(raw_body=json.dumps({"model": "m", "prompt": token_ids})),  # token-id prompt
            pb.ExplainRequest(raw_body=json.dumps({"prompt": [PROMPT, PROMPT]})),  # a batch
            pb.ExplainRequest(raw_body="{" + PROMPT),  # not JSON: rejected, without echoing the body
            pb.ExplainRequest(raw_body=json.dumps([PROMPT])),  # not an object: rejected
            pb.ExplainRequest(path="/v1/models", raw_body=json.dumps({"prompt": PROMPT})),  # passthrough
        ):
            replies.append(await stub.Explain(request, timeout=10))
    # Explain does know that this prompt was just served, and where: the probe issue 13 is about, which is
    # why it is on the admin port only ...
    by_endpoint = {e.endpoint: e for e in replies[0].endpoints}
    assert replies[0].outcome == "routed" and by_endpoint[served].matched_tokens > 0
    assert [r.outcome for r in replies[4:]] == ["rejected", "rejected", "passthrough"]
    # ... but never what the prompt said
    for i, reply in enumerate(replies):
        doc = json_format.MessageToDict(reply, preserving_proto_field_name=True)
        assert_no_prompt(f"Explain reply {i}", doc, json.dumps(doc) + str(reply), WORDS, token_ids)
        assert_no_prompt(f"Explain reply {i}", doc, "", (), chat_ids)
        assert SECRET.encode() not in reply.SerializeToString()
    for path in ("/debug/decisions?n=256", "/debug/state"):
        status, raw = await http_get(ports.debug, path)
        assert status == 200
        doc = json.loads(raw)
        if path.startswith("/debug/decisions"):
            assert {"req-secret-1", "req-secret-2"} <= {d["request_id"] for d in doc}  # the decisions are there
            assert all(d["prompt_tokens"] > 100 for d in doc if d["request_id"].startswith("req-secret"))
        assert_no_prompt(path, doc, raw, WORDS, token_ids)
        assert_no_prompt(path, doc, raw, (), chat_ids)
    # nor the metrics
    status, text = await http_get(ports.metrics, "/metrics")
    assert status == 200 and SECRET.split()[0].lower() not in text.lower()
