"""The full-duplex (Endpoint Picker Protocol) conversation, fed the messages Envoy sends, in-process."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from bench.extproc_inprocess import Feed, buffered_messages, duplex_messages
from loadaware.app import Sidecar
from loadaware.config import from_args
from loadaware.extproc.replies import STREAMED_PIECE_BYTES, streamed_request_body, streamed_response_body

FLEET = ("127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000")
HEADER = "x-gateway-destination-endpoint"


class Recorder(Feed):
    def __init__(self, messages: list[Any]) -> None:
        super().__init__(messages)
        self.sent: list[Any] = []

    async def write(self, reply: bytes) -> None:
        self.sent.append(pb.ProcessingResponse.FromString(reply))


def make(*flags: str, fleet: tuple[str, ...] = FLEET) -> Sidecar:
    return Sidecar(from_args(["--endpoints", ",".join(fleet), "--metrics-listen", "off", "--policy", "leastload",
                              *flags], environ={}))


async def converse(app: Sidecar, messages: list[Any]) -> list[Any]:
    feed = Recorder(messages)
    await app.extproc.process(None, feed)
    return feed.sent


def destination(reply: Any) -> list[str]:
    common = reply.request_headers.response
    values = {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}
    metadata = reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields[HEADER].string_value
    assert values[HEADER] == metadata  # header and envoy.lb metadata say the same
    return metadata.split(",")


def streamed(reply: Any, side: str) -> tuple[bytes, bool]:
    mutation = getattr(reply, side).response.body_mutation.streamed_response
    return mutation.body, mutation.end_of_stream


def body_of(prompt: str = "hello there") -> bytes:
    return json.dumps({"model": "m", "prompt": prompt, "max_tokens": 8, "stream": True}).encode()


def with_metadata(message: Any, namespace: str, key: str, value: Any) -> Any:
    struct = struct_pb2.Struct()
    struct.update({key: value})
    message.metadata_context.filter_metadata[namespace].CopyFrom(struct)
    return message


async def test_request_is_held_decided_once_and_echoed_byte_for_byte() -> None:
    app = make()
    body = body_of("x " * 50_000)  # > one streamed piece: re-emitted in several
    messages = duplex_messages(body, chunks=3)
    sent = await converse(app, messages)
    kinds = [r.WhichOneof("response") for r in sent]
    pieces = -(-len(body) // STREAMED_PIECE_BYTES)
    assert kinds == ["request_headers"] + ["request_body"] * pieces + ["response_headers"] + ["response_body"] * 4
    ranked = destination(sent[0])
    assert ranked[0] in FLEET and sorted(ranked) == sorted(FLEET)  # the choice, then 2 fallbacks
    echoed = [streamed(r, "request_body") for r in sent[1:1 + pieces]]
    assert b"".join(b for b, _ in echoed) == body and [e for _, e in echoed] == [False] * (pieces - 1) + [True]
    responses = [streamed(r, "response_body") for r in sent[-4:]]
    originals = [m.response_body for m in messages[-4:]]
    assert responses == [(m.body, m.end_of_stream) for m in originals]
    assert app.loads.total() == 0 and app.extproc.modes == {"buffered": 0, "full_duplex": 1}


async def test_trailers_end_a_body_that_did_not() -> None:
    app = make()
    messages = duplex_messages(body_of(), chunks=0)[:3]
    messages[2].request_body.end_of_stream = False
    messages.append(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    sent = await converse(app, messages)
    assert [r.WhichOneof("response") for r in sent] == ["request_headers", "request_body", "request_trailers"]
    assert streamed(sent[1], "request_body") == (body_of(), False)


async def test_subset_hint_is_honoured_and_an_ineligible_one_gets_503() -> None:
    app = make()
    messages = duplex_messages(body_of(), chunks=0)
    with_metadata(messages[0], "envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset", [FLEET[2]])
    sent = await converse(app, messages)
    assert destination(sent[0]) == [FLEET[2]]
    messages = duplex_messages(body_of(), chunks=0)
    with_metadata(messages[0], "envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset", ["10.9.9.9:8000"])
    (reply,) = await converse(app, messages)
    immediate = reply.immediate_response
    assert immediate.status.code == 503
    error = json.loads(immediate.body)["error"]
    assert error["code"] == 503 and error["message"] and error["type"]
    assert app.recent.items[-1].outcome == "no_eligible_endpoints" and app.loads.total() == 0


@pytest.mark.parametrize(("setting", "expect_503"), [("auto", True), ("unavailable", True), ("fallback", False)])
async def test_empty_fleet_in_picker_mode(setting: str, expect_503: bool) -> None:
    app = make("--no-endpoint-reply", setting, fleet=())
    sent = await converse(app, duplex_messages(body_of(), chunks=0))
    if expect_503:
        assert [r.WhichOneof("response") for r in sent] == ["immediate_response"]
        assert sent[0].immediate_response.status.code == 503
    else:  # the proxy's own fallback picks: no destination, the body goes on
        assert [r.WhichOneof("response") for r in sent][:2] == ["request_headers", "request_body"]
        assert not sent[0].request_headers.response.header_mutation.set_headers


@pytest.mark.parametrize(("setting", "expect_503"), [("auto", False), ("unavailable", True)])
async def test_empty_fleet_in_buffered_mode(setting: str, expect_503: bool) -> None:
    app = make("--no-endpoint-reply", setting, fleet=())
    sent = await converse(app, buffered_messages(body_of()))
    last = sent[-1]
    if expect_503:
        assert last.immediate_response.status.code == 503
    else:  # today's fail-open pass-through: Envoy's fallback picks
        assert last.WhichOneof("response") == "request_body"
        assert not last.request_body.response.header_mutation.set_headers


async def test_the_served_endpoint_takes_the_count_and_it_ends_with_the_stream() -> None:
    app = make()
    messages = duplex_messages(body_of(), chunks=2)
    response_headers = messages[3]
    seen: dict[str, int] = {}

    class Watch(Recorder):
        async def write(self, reply: bytes) -> None:
            await super().write(reply)
            if self.sent[-1].WhichOneof("response") == "response_headers":
                seen.update(app.loads.snapshot())

    first = await converse(app, duplex_messages(body_of(), chunks=0))
    chosen = destination(first[0])[0]
    other = next(ep for ep in FLEET if ep != chosen)
    with_metadata(response_headers, "envoy.lb", "x-gateway-destination-endpoint-served", other)
    feed = Watch(messages)
    await app.extproc.process(None, feed)
    decision = app.recent.items[-1]
    assert decision.served == other != decision.endpoint
    assert seen.get(other) == 1 and seen.get(decision.endpoint or "", 0) == 0  # moved while it was served
    assert app.loads.total() == 0


async def test_bad_and_oversized_bodies_get_json_errors() -> None:
    app = make("--max-request-body-bytes", "1000")
    (bad,) = await converse(app, duplex_messages(b"{nope", chunks=0))
    assert bad.immediate_response.status.code == 400
    assert json.loads(bad.immediate_response.body)["error"]["type"] == "invalid_request_error"
    sent = await converse(app, duplex_messages(body_of("y" * 5000), chunks=0))
    assert sent[-1].immediate_response.status.code == 413 and app.loads.total() == 0


async def test_requests_without_a_prompt_body_are_decided_on_their_headers() -> None:
    app = make()
    get = duplex_messages(b"", chunks=1)
    get[0].request_headers.headers.headers[0].raw_value = b"GET"
    get[0].request_headers.headers.headers[1].raw_value = b"/v1/models"
    get[0].request_headers.end_of_stream = True
    get = [get[0], *get[3:]]
    sent = await converse(app, get)
    assert sent[0].WhichOneof("response") == "request_headers" and destination(sent[0])[0] in FLEET
    assert streamed(sent[-1], "response_body") == (get[-1].response_body.body, True)


def test_hand_encoded_streamed_mutations_match_protobuf() -> None:
    for body in (b"", b"data: x\n\n", bytes(range(256)) * 300):
        for end in (False, True):
            mutation = pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(body=body, end_of_stream=end))
            response = pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))
            expected = pb.ProcessingResponse(response_body=response).SerializeToString()
            assert streamed_response_body(body, end) == expected
            assert streamed_request_body(body, end) == pb.ProcessingResponse(request_body=response).SerializeToString()


class ResetAfter(Recorder):
    """Envoy resetting the stream once the given messages were read (as it ends full-duplex streams)."""

    async def read(self) -> Any:
        message = await super().read()
        if message is grpc.aio.EOF:
            raise asyncio.CancelledError
        return message


@pytest.mark.parametrize(("chunks_read", "end"), [(None, "eof"), (3, "cancelled")])
async def test_a_reset_after_the_whole_response_is_a_normal_end(chunks_read: int | None, end: str) -> None:
    app = make()
    messages = duplex_messages(body_of(), chunks=5)
    if chunks_read is not None:  # the client went away mid-stream: Envoy resets before the response ended
        messages = messages[:4 + chunks_read]
    with pytest.raises(asyncio.CancelledError):
        await app.extproc.process(None, ResetAfter(messages))
    ends = {s.labels["end"]: s.value for m in app.metrics.streams.collect() for s in m.samples
            if s.name.endswith("_total")}
    assert ends == {end: 1.0} and app.loads.total() == 0


@pytest.mark.parametrize("duplex", [False, True])
async def test_a_large_body_is_parsed_off_the_event_loop(duplex: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from loadaware.extproc import conversation

    threads: list[str] = []
    real_parse = conversation.parse_body

    def recording_parse(kind: str, body: bytes) -> Any:
        threads.append(threading.current_thread().name)
        return real_parse(kind, body)

    monkeypatch.setattr(conversation, "parse_body", recording_parse)
    app = make()
    big = body_of("tok " * 1_000_000)  # ~4 MB: a json.loads that would stall every stream on the loop
    assert len(big) > conversation.INLINE_PARSE_BYTES
    for body in (body_of(), big):
        messages = duplex_messages(body, chunks=0) if duplex else buffered_messages(body)
        await converse(app, messages)
    main = threading.main_thread().name
    assert threads[0] == main and threads[1] != main  # small bodies inline, large ones in a worker thread
    assert app.recent.items[-1].outcome == "routed" and app.loads.total() == 0
