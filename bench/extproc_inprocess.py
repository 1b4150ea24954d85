"""The sidecar's own CPU per request through its ext_proc code, in-process: no gRPC transport, no Envoy.

    python -m bench.extproc_inprocess [--quick] [--json]

Each request is the message sequence Envoy sends, fed to the servicer's stream handler; replies are
discarded. BUFFERED: headers, then the whole body. Full duplex (the InferencePool picker's mode):
protocol_config + headers, the body in two chunks, response headers, a 64-chunk streamed response (one SSE
event per token) and its end. The per-chunk figure is the cost of echoing one response chunk. What this
leaves out (grpcio's per-message cost, Envoy) is what the end-to-end cases of `make bench` measure.
Times are process CPU (all threads, so the tokenizer's too).

Rows: `leastload` on a tiny prompt (the floor), and on a 1,300-word prompt with a tokenizer and the
approximate index the seed's `loadaware` (which the default, `auto`, resolves to) and `banded`. Those two are
measured in alternating rounds on the same body, so a busy machine slows both alike; the table gives banded's
cost minus loadaware's (the placement issue's bound for a cleverer default: at most +10 µs).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from bench import inprocess_cli
from loadaware.app import Sidecar
from loadaware.config import from_args
from sim.fleet import DEFAULT_TOKENIZER as TINY_MODEL_DIR

FLEET = "127.0.0.2:8000,127.0.0.3:8000,127.0.0.4:8000"
RESPONSE_CHUNKS = 64
ROUNDS = 5  # alternating rounds of the two policies compared on the long prompt
COMPARED = ("loadaware", "banded")
Mode = processing_mode_pb2.ProcessingMode


def _headers(path: str = "/v1/completions") -> Any:
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=":method", raw_value=b"POST"),
        base_pb2.HeaderValue(key=":path", raw_value=path.encode()),
        base_pb2.HeaderValue(key="x-request-id", raw_value=b"bench")]))


def buffered_messages(body: bytes) -> list[Any]:
    return [pb.ProcessingRequest(request_headers=_headers()),
            pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))]


def duplex_messages(body: bytes, chunks: int = RESPONSE_CHUNKS) -> list[Any]:
    half = len(body) // 2
    config = pb.ProtocolConfiguration(request_body_mode=Mode.FULL_DUPLEX_STREAMED,
                                      response_body_mode=Mode.FULL_DUPLEX_STREAMED)
    event = b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" tok"}]}\n\n'
    return [pb.ProcessingRequest(request_headers=_headers(), protocol_config=config),
            pb.ProcessingRequest(request_body=pb.HttpBody(body=body[:half])),
            pb.ProcessingRequest(request_body=pb.HttpBody(body=body[half:], end_of_stream=True)),
            pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
                base_pb2.HeaderValue(key=":status", raw_value=b"200")]))),
            *[pb.ProcessingRequest(response_body=pb.HttpBody(body=event)) for _ in range(chunks)],
            pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: [DONE]\n\n", end_of_stream=True))]


class Feed:
    """A stand-in for grpc.aio's servicer context: reads the prepared messages, discards the replies."""

    def __init__(self, messages: list[Any]) -> None:
        self._messages = iter(messages)
        self.replies = 0

    async def read(self) -> Any:
        return next(self._messages, grpc.aio.EOF)

    async def write(self, reply: bytes) -> None:
        self.replies += 1

    def cancelled(self) -> bool:  # the stream ended by EOF: nobody cancelled it
        return False


async def _cpu_us(app: Sidecar, messages: list[Any], n: int) -> float:
    for _ in range(min(200, n)):
        await app.extproc.process(None, Feed(messages))
    started = time.process_time()
    for _ in range(n):
        await app.extproc.process(None, Feed(messages))
    return (time.process_time() - started) / n * 1e6


def _app(policy: str) -> Sidecar:
    flags = ["--endpoints", FLEET, "--metrics-listen", "off", "--policy", policy]
    if policy != "leastload":
        flags += ["--tokenizer", str(TINY_MODEL_DIR), "--prefix-source", "approx"]
    return Sidecar(from_args(flags, environ={}))


async def _figures(app: Sidecar, body: bytes, n: int) -> dict[str, float]:
    buffered = await _cpu_us(app, buffered_messages(body), n)
    duplex = await _cpu_us(app, duplex_messages(body), n // 2)
    bare = await _cpu_us(app, duplex_messages(body, chunks=0), n // 2)
    return {"buffered_us": buffered, "full_duplex_us": duplex,
            "per_response_chunk_us": (duplex - bare) / RESPONSE_CHUNKS}


async def _run(quick: bool) -> dict[str, Any]:
    n = 300 if quick else 3000
    out: dict[str, Any] = {"response_chunks": RESPONSE_CHUNKS}
    tiny = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()
    long = json.dumps({"model": "m", "prompt": "the engine cache prefix token " * 260, "max_tokens": 64}).encode()
    app = _app("leastload")
    out["leastload"] = {"prompt_bytes": len(tiny), **await _figures(app, tiny, n)}
    apps = {policy: _app(policy) for policy in COMPARED}
    rounds: dict[str, list[dict[str, float]]] = {policy: [] for policy in COMPARED}
    try:
        for _ in range(ROUNDS):
            for policy in COMPARED:
                rounds[policy].append(await _figures(apps[policy], long, max(2, n // ROUNDS)))
    finally:
        for a in apps.values():
            if a.tokenizer is not None:
                a.tokenizer.close()
    for policy, rs in rounds.items():
        out[policy] = {"prompt_bytes": len(long), "resolved": apps[policy].settings.effective_policy,
                       **{k: sum(r[k] for r in rs) / len(rs) for k in rs[0]}}
    return out


def run(quick: bool = False) -> dict[str, Any]:
    return asyncio.run(_run(quick))


def table(result: dict[str, Any]) -> str:
    rows = ["### 6. The sidecar's ext_proc code in-process (no transport): CPU per request\n",
            "| policy, prompt | BUFFERED | full duplex, 64-chunk streamed response | per response chunk |",
            "|---|---|---|---|"]
    for policy in ("leastload", *COMPARED):
        r = result[policy]
        name = policy if r.get("resolved", policy) == policy else f"{policy} (the default: {r['resolved']})"
        rows.append(f"| {name}, {r['prompt_bytes']:,} B body | {r['buffered_us']:,.1f} µs | "
                    f"{r['full_duplex_us']:,.1f} µs | {r['per_response_chunk_us']:,.2f} µs |")
    base, ours = (result[p] for p in COMPARED)
    rows.append(f"\nbanded's cost over loadaware's, the default's (bound for a cleverer default: +10 µs): "
                f"{ours['buffered_us'] - base['buffered_us']:+,.1f} µs "
                f"BUFFERED, {ours['full_duplex_us'] - base['full_duplex_us']:+,.1f} µs full duplex "
                f"({ROUNDS} alternating rounds).")
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    return inprocess_cli.main("python -m bench.extproc_inprocess", __doc__, run, table, argv)


if __name__ == "__main__":
    sys.exit(main())
