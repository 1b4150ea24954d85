"""A stand-in ext_proc server that does nothing but the BUFFERED protocol: the transport's floor.

    python -m bench.floor_server --port P --engines A,B,C [--server aio|sync] [--processes N]

It answers exactly the messages envoy/envoy.yaml sends (request headers, the body, response headers) with
pre-serialized replies and names the engines round robin: no parsing, no tokenizer, no scoring, no metrics.
What it costs per request is what grpcio costs; the sidecar's own CPU is everything above it. Variants
(`bench.transport_floor` runs them side by side):

- aio: grpc.aio on uvloop, one event loop (what the sidecar runs);
- sync: grpc's thread-pool server (each stream holds a worker thread while it lives);
- grpclib: gRPC in pure Python on the event loop (h2), no grpcio at all (a dev dependency, not the
  product's);
- --loop asyncio: aio on asyncio's own event loop instead of uvloop's;
- --processes N: N aio processes on one port with SO_REUSEPORT (the kernel spreads connections; Envoy opens
  one HTTP/2 connection per worker thread, so N only helps when Envoy runs as many workers).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import uvloop
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from loadaware.extproc.replies import Replies as ProductReplies
from loadaware.extproc.stream import METHOD, SERVICE_NAME

HEADER = "x-gateway-destination-endpoint"


class Replies:
    """The sidecar's own reply bytes (loadaware/extproc/replies.py), the engines named round robin."""

    def __init__(self, engines: Sequence[str]) -> None:
        product = ProductReplies(HEADER)
        self.headers = product.headers_continue
        self.response_headers = product.response_headers_continue
        ring = tuple(engines)
        self.bodies = [product.body_route(ring[i:] + ring[:i]) for i in range(len(ring))]
        self._turn = itertools.cycle(range(len(ring)))

    def reply(self, which: str | None) -> bytes:
        if which == "request_body":
            return self.bodies[next(self._turn)]
        if which == "response_headers":
            return self.response_headers
        return self.headers


def _handler(method: Any) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(SERVICE_NAME, {METHOD: grpc.stream_stream_rpc_method_handler(
        method, request_deserializer=pb.ProcessingRequest.FromString, response_serializer=None)})


async def serve_aio(port: int, replies: Replies, reuse_port: bool) -> None:
    async def process(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:
                return
            await context.write(replies.reply(msg.WhichOneof("request")))

    server = grpc.aio.server(options=[("grpc.so_reuseport", 1 if reuse_port else 0),
                                      ("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    server.add_generic_rpc_handlers((_handler(process),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)


async def serve_grpclib(port: int, replies: Replies) -> None:
    """The same on grpclib: gRPC in pure Python on the event loop (h2 framing), no C-core poller thread."""
    from grpclib.const import Cardinality, Handler
    from grpclib.encoding.proto import ProtoCodec
    from grpclib.server import Server

    class PassThroughCodec(ProtoCodec):
        def encode(self, message: Any, message_type: Any) -> bytes:
            return message if isinstance(message, bytes) else super().encode(message, message_type)

    class ExtProc:
        async def process(self, stream: Any) -> None:
            async for msg in stream:
                await stream.send_message(replies.reply(msg.WhichOneof("request")))

        def __mapping__(self) -> dict[str, Any]:
            return {f"/{SERVICE_NAME}/{METHOD}": Handler(self.process, Cardinality.STREAM_STREAM, pb.ProcessingRequest,
                                                   pb.ProcessingResponse)}

    server = Server([ExtProc()], codec=PassThroughCodec())
    await server.start("127.0.0.1", port)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()


def serve_sync(port: int, replies: Replies) -> None:
    def process(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[bytes]:
        for msg in requests:
            yield replies.reply(msg.WhichOneof("request"))

    server = grpc.server(ThreadPoolExecutor(max_workers=256), options=[
        ("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    server.add_generic_rpc_handlers((_handler(process),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    server.wait_for_termination()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.floor_server", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--engines", required=True)
    p.add_argument("--server", choices=("aio", "sync", "grpclib"), default="aio")
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop",
                   help="aio: the event loop (the sidecar runs uvloop)")
    args = p.parse_args(argv)
    replies = Replies(args.engines.split(","))
    if args.server == "sync":
        serve_sync(args.port, replies)
        return
    if args.server == "grpclib":
        uvloop.run(serve_grpclib(args.port, replies))
        return
    workers: list[subprocess.Popen[bytes]] = []
    if args.processes > 1:  # the others, spawned before any grpc state exists in this process
        worker_argv = [sys.executable, "-m", "bench.floor_server", "--port", str(args.port),
                       "--engines", args.engines, "--processes", "0", "--loop", args.loop]
        workers = [subprocess.Popen(worker_argv) for _ in range(args.processes - 1)]
    try:
        if args.loop == "uvloop":
            uvloop.run(serve_aio(args.port, replies, reuse_port=args.processes != 1))
        else:
            asyncio.run(serve_aio(args.port, replies, reuse_port=args.processes != 1))
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(5)


def children_cpu_pids(pid: int) -> list[int]:
    """`pid` and its direct children (the extra --processes workers)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [pid, *(int(c) for c in f.read().split())]
    except OSError:
        return [pid]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
