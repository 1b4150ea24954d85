"""A property-based fuzzer of ext_proc conversations, spoken straight to the sidecar's servicer (no Envoy).

Each case is one stream: a plausible request (headers, a body in chunks, trailers, the response's headers,
chunks and trailers) in either processing mode (the first message's `protocol_config` picks it), then
mutated: messages dropped, repeated, swapped, random ones inserted, the stream reset by the client part
way. Header bytes, metadata and bodies are drawn from the whole space (any bytes, every JSON shape, deep
nesting). `check_case` runs one case and returns what broke:

- no exception escapes the stream (the `end="error"` stream metric stays put, nothing is logged at ERROR);
- the stream takes at most one in-flight count and releases exactly what it took (the load tracker's total
  is back where it was; every decision of the stream has ended);
- a refused request in picker mode carries an OpenAI-style JSON error;
- the engine the response reports as having served is believed only if it is in the fleet.

In process (`InProcessContext`: a stand-in for grpc.aio's servicer context) or over real gRPC on loopback
(`FuzzRig.start_grpc`). Used by tests/unit/test_extproc_fuzz.py and the `fuzz` case of `make bench`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2
from hypothesis import strategies as st

from loadaware.app import Sidecar
from loadaware.config import from_args
from loadaware.extproc.stream import METHOD, SERVICE_NAME
from loadaware.lifecycle import Decision
from sim.fleet import DEFAULT_TOKENIZER

FLEET = ("127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000")
Mode = processing_mode_pb2.ProcessingMode
DUPLEX_CONFIG = pb.ProtocolConfiguration(request_body_mode=Mode.FULL_DUPLEX_STREAMED,
                                         response_body_mode=Mode.FULL_DUPLEX_STREAMED)

# ---- generation ----
# One case builder, two sources of choices: hypothesis (`cases()`, the tests: shrinking, its recursive JSON
# strategy) and a seeded `random.Random` (`random_case`, the 100,000-case bench: hypothesis spends ~20x
# longer choosing a case than the sidecar spends running it). Sizes stay small: the space is in the shapes.

T = TypeVar("T")


class Chooser(Protocol):
    def integer(self, lo: int, hi: int) -> int: ...

    def boolean(self) -> bool: ...

    def pick(self, options: Sequence[T]) -> T: ...

    def binary(self, max_size: int, min_size: int = 0) -> bytes: ...

    def text(self, max_size: int) -> str: ...

    def json(self) -> Any: ...


json_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(st.text(max_size=6), children, max_size=4), max_leaves=8)


class DrawChooser:
    """Choices drawn by hypothesis. Strategies are built once per shape and reused: one built per draw is
    validated again each time, which costs more than the draw."""

    _strategies: ClassVar[dict[tuple[Any, ...], st.SearchStrategy[Any]]] = {}

    def __init__(self, draw: st.DrawFn) -> None:
        self._draw = draw

    def _get(self, key: tuple[Any, ...], make: Callable[[], st.SearchStrategy[Any]]) -> Any:
        strategy = self._strategies.get(key)
        if strategy is None:
            strategy = self._strategies[key] = make()
        return self._draw(strategy)

    def integer(self, lo: int, hi: int) -> int:
        return int(self._get(("int", lo, hi), lambda: st.integers(lo, hi)))

    def boolean(self) -> bool:
        return bool(self._get(("bool",), st.booleans))

    def pick(self, options: Sequence[T]) -> T:
        return options[self.integer(0, len(options) - 1)]

    def binary(self, max_size: int, min_size: int = 0) -> bytes:
        return bytes(self._get(("bytes", min_size, max_size), lambda: st.binary(min_size=min_size, max_size=max_size)))

    def text(self, max_size: int) -> str:
        return str(self._get(("text", max_size), lambda: st.text(max_size=max_size)))

    def json(self) -> Any:
        return self._draw(json_values)


class RandomChooser:
    """Choices from a seeded `random.Random`: the same shapes, chosen ~20x faster."""

    SCALARS = (None, True, False, 0, -1, 2**70, 1.5, float("nan"), float("inf"), "", "m", "\u00e9\U0001f600")

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def boolean(self) -> bool:
        return self.rng.random() < 0.5

    def pick(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def binary(self, max_size: int, min_size: int = 0) -> bytes:
        return self.rng.randbytes(self.rng.randint(min_size, max_size))

    def text(self, max_size: int) -> str:
        n = self.rng.randint(0, max_size)
        # ASCII mostly, some of the rest of Unicode (no surrogates: protobuf strings are UTF-8)
        return "".join(chr(self.rng.choice((self.rng.randint(32, 126), self.rng.randint(0, 0xD7FF),
                                            self.rng.randint(0xE000, 0x10FFFF)))) for _ in range(n))

    def json(self, leaves: int = 8) -> Any:
        roll = self.rng.random()
        if leaves <= 1 or roll < 0.4:
            return self.rng.choice((self.pick(self.SCALARS), self.text(12), self.rng.randint(-(2**70), 2**70)))
        n = self.rng.randint(0, 4)
        if roll < 0.7:
            return [self.json(leaves // max(1, n)) for _ in range(n)]
        return {self.text(6): self.json(leaves // max(1, n)) for _ in range(n)}


ROLES = ("user", "assistant", "system", "tool")
BODY_SHAPES = ("completions", "chat", "responses", "messages", "json", "bytes", "deep", "empty")
EXTRA_FIELDS = ("stream", "cache_salt", "tools", "chat_template_kwargs", "x")
DEEP_DEPTHS = (63, 64, 65, 66, 200, 999, 1001, 5000)
DEEP_OPENERS = ((b"[", b"]"), (b'{"a":', b"}"))
HEADER_BYTES = (b"POST", b"GET", b"/v1/completions", b"/v1/chat/completions?x=1", b"abc\xffdef", b"",
                b"\x00\n\r", b"200", b"500")
HEADER_KEYS = (":method", ":path", ":status", "x-request-id", "content-type", "", "x-gateway-destination-endpoint",
               "X-Request-Id")
METHODS = (b"POST", b"POST", b"POST", b"GET")
PATHS = (b"/v1/completions", b"/v1/chat/completions", b"/v1/responses", b"/v1/messages", b"/v1/responses/resp_f1",
         b"/v1/responses/resp_f1/cancel")
STATUSES = (b"200", b"500", b"404", b"503")
MUTATIONS = ("drop", "dup", "swap", "insert")
OTHER_MODES = (Mode.BUFFERED, Mode.STREAMED, Mode.NONE)


def _token_ids(c: Chooser) -> list[Any]:
    return [c.integer(-5, 2**40) if c.integer(0, 9) else c.boolean() for _ in range(c.integer(0, 20))]


def _prompt(c: Chooser) -> Any:
    shape = c.integer(0, 4)
    if shape == 0:
        return c.text(80)
    if shape == 1:
        return _token_ids(c)
    if shape == 2:
        return [c.text(20) for _ in range(c.integer(0, 3))]
    if shape == 3:
        return [_token_ids(c) for _ in range(c.integer(0, 2))]
    return c.json()


def _messages(c: Chooser) -> Any:
    if c.integer(0, 3) == 0:
        return c.json()
    return [{"role": c.pick(ROLES) if c.integer(0, 3) else c.json(),
             "content": c.text(60) if c.integer(0, 2) else c.json()} for _ in range(c.integer(0, 4))]


def request_body(c: Chooser) -> bytes:
    shape = c.pick(BODY_SHAPES)
    if shape in ("completions", "chat", "responses", "messages"):
        doc: dict[str, Any] = {"model": "m" if c.integer(0, 3) else c.json()}
        if shape == "completions":
            doc["prompt"] = _prompt(c)
        elif shape == "responses":
            doc["input"] = c.text(60) if c.boolean() else _messages(c)
            if c.boolean():
                doc["previous_response_id"] = "resp_f1" if c.boolean() else c.json()
        else:
            doc["messages"] = _messages(c)
        if c.boolean():
            doc[c.pick(EXTRA_FIELDS)] = c.json()
        return json.dumps(doc).encode()
    if shape == "json":
        return json.dumps(c.json()).encode()
    if shape == "bytes":
        return c.binary(60)
    if shape == "deep":
        depth = c.pick(DEEP_DEPTHS)
        opener, closer = c.pick(DEEP_OPENERS)
        tail = closer * depth if c.boolean() else b""
        return b'{"prompt":' + opener * depth + b"1" + tail + b"}" if c.boolean() else opener * depth + tail
    return b""


def _header_bytes(c: Chooser, likely: Sequence[bytes] = HEADER_BYTES) -> bytes:
    return c.pick(likely) if c.integer(0, 3) else (c.pick(HEADER_BYTES) if c.boolean() else c.binary(40))


def _header(c: Chooser, key: str, raw: bytes) -> base_pb2.HeaderValue:
    if c.integer(0, 7) == 0:  # the deprecated string field instead of raw_value
        return base_pb2.HeaderValue(key=key, value=c.text(40))
    return base_pb2.HeaderValue(key=key, raw_value=raw)


def _metadata_value(c: Chooser) -> Any:
    shape = c.integer(0, 2)
    if shape == 0:
        return [c.pick(FLEET) if c.boolean() else c.text(20) for _ in range(c.integer(0, 3))]
    if shape == 1:
        return c.pick(FLEET) if c.boolean() else c.text(20)
    return c.json()


def _set_metadata(msg: pb.ProcessingRequest, namespace: str, key: str, value: Any) -> None:
    struct = struct_pb2.Struct()
    try:
        struct.update({key: value})
    except (ValueError, TypeError, OverflowError):  # a value protobuf's Struct cannot hold: no metadata
        return
    msg.metadata_context.filter_metadata[namespace].CopyFrom(struct)


def request_headers(c: Chooser) -> pb.ProcessingRequest:
    request_id = c.binary(600, min_size=200) if c.integer(0, 4) == 0 else _header_bytes(c)
    items = [_header(c, ":method", _header_bytes(c, METHODS)), _header(c, ":path", _header_bytes(c, PATHS)),
             _header(c, "x-request-id", request_id)]
    for _ in range(c.integer(0, 3)):
        items.append(_header(c, c.pick(HEADER_KEYS) if c.boolean() else c.text(16), _header_bytes(c)))
    if c.boolean():
        items.reverse()
    msg = pb.ProcessingRequest(request_headers=pb.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=items), end_of_stream=c.boolean()))
    if c.integer(0, 3) == 0:
        _set_metadata(msg, "envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset", _metadata_value(c))
    return msg


def response_headers(c: Chooser) -> pb.ProcessingRequest:
    msg = pb.ProcessingRequest(response_headers=pb.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[_header(c, ":status", _header_bytes(c, STATUSES))]),
        end_of_stream=c.boolean()))
    if c.boolean():
        _set_metadata(msg, "envoy.lb", "x-gateway-destination-endpoint-served", _metadata_value(c))
    return msg


def body_message(side: str, body: bytes, end_of_stream: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(**{side: pb.HttpBody(body=body, end_of_stream=end_of_stream)})


def _chunked(c: Chooser, side: str, body: bytes) -> list[pb.ProcessingRequest]:
    cuts = sorted({c.integer(0, len(body)) for _ in range(c.integer(0, 3))})
    bounds = [0, *cuts, len(body)]
    parts = [body[a:b] for a, b in itertools.pairwise(bounds)]
    return [body_message(side, part, i == len(parts) - 1) for i, part in enumerate(parts)]


def any_message(c: Chooser) -> pb.ProcessingRequest:
    kind = c.integer(0, 6)
    if kind == 0:
        return request_headers(c)
    if kind == 1:
        return body_message("request_body", c.binary(60), c.boolean())
    if kind == 2:
        return pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    if kind == 3:
        return response_headers(c)
    if kind == 4:
        return body_message("response_body", b'{"id": "resp_f1"}' if c.integer(0, 3) == 0 else c.binary(60),
                            c.boolean())
    if kind == 5:
        return pb.ProcessingRequest(response_trailers=pb.HttpTrailers())
    return pb.ProcessingRequest()  # no oneof set at all


@dataclass
class Case:
    duplex: bool
    messages: list[pb.ProcessingRequest]
    cancel_at: int | None  # the client resets the stream before reading message `cancel_at` (None: EOF)
    mutations: list[str] = field(default_factory=list)

    def __repr__(self) -> str:  # what hypothesis prints for a failing case
        kinds = [m.WhichOneof("request") or "empty" for m in self.messages]
        return f"Case(duplex={self.duplex}, cancel_at={self.cancel_at}, kinds={kinds}, mutations={self.mutations})"


def build_case(c: Chooser) -> Case:
    """One stream: a plausible request and response, then mutated."""
    duplex = c.boolean()
    headers = request_headers(c)
    headers.request_headers.end_of_stream = c.integer(0, 7) == 0  # mostly a body follows, as from Envoy
    messages = [headers, *_chunked(c, "request_body", request_body(c))]
    if c.boolean():
        messages.append(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    messages.append(response_headers(c))
    messages += _chunked(c, "response_body", c.binary(40))
    if c.boolean():
        messages.append(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()))
    done: list[str] = []
    for _ in range(c.integer(0, 4)):
        op = c.pick(MUTATIONS)
        if not messages and op != "insert":
            continue
        i = c.integer(0, max(0, len(messages) - 1))
        if op == "drop":
            messages.pop(i)
        elif op == "dup":
            messages.insert(i, messages[i])
        elif op == "swap":
            j = c.integer(0, len(messages) - 1)
            messages[i], messages[j] = messages[j], messages[i]
        else:
            messages.insert(i, any_message(c))
        done.append(f"{op}@{i}")
    if messages:
        first = pb.ProcessingRequest()
        first.CopyFrom(messages[0])  # the first message announces the mode (copied: it may be repeated later)
        if duplex:
            first.protocol_config.CopyFrom(DUPLEX_CONFIG)
        elif c.integer(0, 7) == 0:  # a protocol_config naming another mode: BUFFERED
            first.protocol_config.request_body_mode = c.pick(OTHER_MODES)
        messages[0] = first
    cancel_at = c.integer(0, len(messages)) if c.boolean() else None
    return Case(duplex, messages, cancel_at, done)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """The fuzzer's cases as a hypothesis strategy."""
    return build_case(DrawChooser(draw))


def random_case(rng: random.Random) -> Case:
    return build_case(RandomChooser(rng))


# ---- the rig ----

class ErrorLog(logging.Handler):
    """Counts records at ERROR and above (the fuzzer's "nothing logged at ERROR")."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class DecisionsPerStream:
    """A lifecycle listener: the decisions taken (counted) since the last `take`."""

    def __init__(self) -> None:
        self.decided: list[Decision] = []

    def on_decided(self, decision: Decision) -> None:
        self.decided.append(decision)

    def on_served(self, decision: Decision, previous: str | None) -> None:
        pass

    def on_ended(self, decision: Decision) -> None:
        pass

    def take(self) -> list[Decision]:
        taken, self.decided = self.decided, []
        return taken


def fuzz_sidecar(policy: str = "loadaware") -> Sidecar:
    # The fleet is names only: asking it who holds a stored response times out, so quickly.
    flags = ["--endpoints", ",".join(FLEET), "--metrics-listen", "off", "--policy", policy,
             "--state-probe-timeout-s", "0.02"]
    if policy == "loadaware":
        flags += ["--tokenizer", str(DEFAULT_TOKENIZER), "--prefix-source", "approx"]
    return Sidecar(from_args(flags, environ={}))


class InProcessContext:
    """A stand-in for grpc.aio's servicer context: reads the case's messages, then EOF or the client's reset
    (CancelledError at that read, as grpc.aio cancels the handler's task)."""

    def __init__(self, case: Case, replies: list[bytes]) -> None:
        self._messages = case.messages
        self._cancel_at = case.cancel_at
        self._next = 0
        self._replies = replies

    async def read(self) -> Any:
        i = self._next
        self._next += 1
        if i == self._cancel_at:
            raise asyncio.CancelledError
        return self._messages[i] if i < len(self._messages) else grpc.aio.EOF

    async def write(self, reply: bytes) -> None:
        self._replies.append(reply)

    def cancelled(self) -> bool:  # the stream ended by EOF: nobody cancelled it
        return False


class FuzzRig:
    """One sidecar under fuzz: runs cases on it and checks the invariants after each."""

    def __init__(self, app: Sidecar) -> None:
        self.app = app
        self.errors = ErrorLog()
        logging.getLogger().addHandler(self.errors)
        self.decisions = DecisionsPerStream()
        app.lifecycle.subscribe(self.decisions)
        self.channel: grpc.aio.Channel | None = None
        self.server: grpc.aio.Server | None = None

    def close_logging(self) -> None:
        logging.getLogger().removeHandler(self.errors)

    def stream_errors(self) -> float:
        # this one metric's samples (the registry's get_sample_value renders every metric: slower than a case)
        for metric in self.app.metrics.streams.collect():
            for sample in metric.samples:
                if sample.name == "loadaware_extproc_streams_total" and sample.labels.get("end") == "error":
                    return float(sample.value)
        return 0.0

    async def start_grpc(self) -> None:
        """A real grpc.aio server on loopback, the servicer behind it, and a client channel to it."""
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((self.app.extproc.handler(),))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")

    async def stop_grpc(self) -> None:
        """The gRPC server and channel, and the HTTP session the state probes opened."""
        if self.channel is not None:
            await self.channel.close()
        if self.server is not None:
            await self.server.stop(None)
        await self.app.state_probe.close()

    async def run_in_process(self, case: Case) -> list[bytes]:
        replies: list[bytes] = []
        try:
            await self.app.extproc.process(None, InProcessContext(case, replies))
        except asyncio.CancelledError:
            if case.cancel_at is None:
                raise
        return replies

    async def run_over_grpc(self, case: Case) -> list[bytes]:
        assert self.channel is not None
        call = self.channel.stream_stream(f"/{SERVICE_NAME}/{METHOD}", request_serializer=None,
                                          response_deserializer=None)()
        replies: list[bytes] = []

        async def read_all() -> None:
            async for reply in call:
                replies.append(reply)

        reader = asyncio.ensure_future(read_all())
        try:
            for i, msg in enumerate(case.messages):
                if i == case.cancel_at:
                    break
                await call.write(msg.SerializeToString())
            if case.cancel_at is not None:
                await asyncio.sleep(0.002)  # let the server read what was sent, then reset mid-stream
                call.cancel()
            else:
                await call.done_writing()
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            pass  # the sidecar answered (and ended the stream) before the client was done: allowed
        try:
            await asyncio.wait_for(reader, 5.0)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        if not await self.servicer_done():
            raise TimeoutError("the server's side of the stream was still open 5 s after the call ended")
        return replies

    async def servicer_done(self, timeout_s: float = 5.0) -> bool:
        """The client's call is over; wait for the server side of the stream to have ended too."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.app.extproc.open_streams and loop.time() < deadline:
            await asyncio.sleep(0.001)
        return not self.app.extproc.open_streams

    async def check_case(self, case: Case, over_grpc: bool = False) -> list[str]:
        """Run one case; what broke (empty: every invariant held)."""
        total_before = self.app.loads.total()
        errors_before = self.stream_errors()
        logged_before = len(self.errors.records)
        problems: list[str] = []
        try:
            replies = await (self.run_over_grpc(case) if over_grpc else self.run_in_process(case))
        except Exception as exc:  # noqa: BLE001 - the very thing the fuzzer looks for
            problems.append(f"exception escaped the stream: {type(exc).__name__}: {exc}")
            replies = []
        decided = self.decisions.take()
        counted = [d for d in decided if d.lease is not None]
        if len(decided) > 1:
            problems.append(f"{len(decided)} decisions on one stream")
        if any(not d.ended for d in decided):
            problems.append("a decision never ended")
        if any(d.served is not None and d.served not in FLEET for d in decided):
            problems.append("a served endpoint outside the fleet was believed")
        leaked = self.app.loads.total() - total_before
        if leaked:
            problems.append(f"in-flight count leaked: {leaked:+g} ({len(counted)} counted)")
        if self.stream_errors() != errors_before:
            problems.append("a stream ended in error")
        if len(self.errors.records) != logged_before:
            problems.append("logged at ERROR: " + self.errors.records[-1].getMessage()[:200])
        problems += json_error_problems(replies, case.duplex)
        return problems

    def leaked(self) -> float:
        return self.app.loads.total()


def json_error_problems(replies: list[bytes], duplex: bool) -> list[str]:
    """In picker mode, every local 4xx/5xx reply carries an OpenAI-style JSON error body."""
    problems: list[str] = []
    for raw in replies:
        reply = pb.ProcessingResponse.FromString(raw)
        if not duplex or not reply.HasField("immediate_response"):
            continue
        immediate = reply.immediate_response
        try:
            error = json.loads(immediate.body)["error"]
            if not ({"message", "type", "param", "code"} <= set(error) and error["code"] == immediate.status.code):
                problems.append(f"local reply's JSON error is incomplete: {immediate.body[:120]!r}")
        except (ValueError, KeyError, TypeError):
            problems.append(f"local reply is not a JSON error: {immediate.body[:120]!r}")
    return problems


async def a_normal_request_decides(app: Sidecar) -> Decision | None:
    """The sidecar still answers: a plain BUFFERED completion is decided and routed to the fleet."""
    body = json.dumps({"model": "m", "prompt": "hello after the fuzz", "max_tokens": 1}).encode()
    messages = [pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=":method", raw_value=b"POST"),
        base_pb2.HeaderValue(key=":path", raw_value=b"/v1/completions")]))),
        body_message("request_body", body, True)]
    listener = DecisionsPerStream()
    app.lifecycle.subscribe(listener)
    replies: list[bytes] = []
    await app.extproc.process(None, InProcessContext(Case(False, messages, None), replies))
    seen = listener.take()
    return seen[0] if seen else None

