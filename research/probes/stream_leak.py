"""Native heap left behind per grpc.aio stream, by how the stream ends and how its handler ends it.

    python -m research.probes.stream_leak [--streams 6000]
    python -m research.probes.stream_leak --curve cancel|eof [--streams 400000] [--steps 8] [--messages 10]
        [--size 1000]

A grpc.aio server in a process of its own (so only the server's heap is measured) with an ext_proc-shaped
stream-stream handler: read one message, write one reply, read until EOF. A client process opens streams
and ends each one either by half-closing (EOF, as Envoy closes a stream) or by cancelling it while the handler
waits in its read (as Envoy resets one). The handler, at the EOF its read returns, either returns (grpc.aio
then sends a status) or goes through `end_at_eof` first (loadaware/extproc/stream_end.py), with plain or
shielded reads and writes (loadaware/extproc/shielded.py: the stream's reads in one task, its writes in
another). Printed per stream:
the growth of glibc's malloc bytes in use (mallinfo2: native allocations, and Python objects above 512 B) and
of Python's allocated blocks (sys.getallocatedblocks: every live Python object), after a warm-up and a full
collection on each side.

`--curve END`: one case only (the sidecar's handler, the client ending each stream by END), each stream
`--messages` round trips of `--size` bytes, and the growth printed after every `--streams / --steps` streams:
whether what a stream keeps levels off or stays the same per stream (a leak), over hundreds of thousands.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from loadaware.collector import malloc_counts
from loadaware.extproc.shielded import ShieldedReads, ShieldedWrites
from loadaware.extproc.stream_end import end_at_eof

SERVICE, STREAM, STATS = "bench.Leak", "Stream", "Stats"
WARMUP = 2000


def malloc_in_use() -> int:
    counts = malloc_counts()
    if counts is None:
        raise SystemExit("needs glibc's mallinfo2")
    return counts()[0]


HANDLERS = ("return", "end_at_eof", "shielded+end_at_eof")  # the last is the sidecar's (extproc/stream.py)


def serve(handler_end: str, port_file: Path, use_uvloop: bool) -> None:
    async def stream(_requests: Any, context: grpc.aio.ServicerContext) -> None:
        read, write = context.read, context.write
        shielded_io = None
        if handler_end.startswith("shielded"):  # as extproc/stream.py: one reading task, one writing task
            shielded_io = ShieldedReads(read), ShieldedWrites(write)
            read, write = shielded_io
        try:
            while await read() is not grpc.aio.EOF:  # an answer to every message, as ext_proc's
                await write(b"x" * 50)
            if handler_end.endswith("end_at_eof"):
                await end_at_eof(context)
        finally:
            if shielded_io is not None:
                shielded_io[0].close()
                shielded_io[1].close()

    async def stats(_request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
        gc.collect()
        return f"{malloc_in_use()} {sys.getallocatedblocks()}".encode()

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            STREAM: grpc.stream_stream_rpc_method_handler(stream),
            STATS: grpc.unary_unary_rpc_method_handler(stats)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_file.write_text(str(port))
        await server.wait_for_termination()

    if use_uvloop:
        import uvloop

        uvloop.install()
    asyncio.run(main())


async def end_stream(call: grpc.aio.StreamStreamCall, how: str, handler_waits_s: float) -> None:
    """End a client's stream the way `how` says: "eof" (done writing) or a cancel once the handler has had
    `handler_waits_s` to be waiting in its read; then wait for the call's status."""
    if how == "eof":
        await call.done_writing()
    else:
        if handler_waits_s:
            await asyncio.sleep(handler_waits_s)
        call.cancel()
    try:
        await call.code()
    except asyncio.CancelledError:
        pass


async def drive(port: int, stream_end: str, streams: int, steps: int = 1, messages: int = 1,
                size: int = 140, new_connection_each_step: bool = False) -> tuple[float, float]:
    """(malloc bytes, Python blocks) the server kept per stream; with several steps, the growth after each is
    printed as it goes. `new_connection_each_step`: each step's streams on a connection of their own, the
    previous one closed (as a server's maximum connection age makes Envoy reconnect)."""
    target = f"127.0.0.1:{port}"
    async with grpc.aio.insecure_channel(target) as channel:
        stats = channel.unary_unary(f"/{SERVICE}/{STATS}")
        streams_channel = grpc.aio.insecure_channel(target) if new_connection_each_step else channel
        request = b"r" * size

        async def one() -> None:
            call = streams_channel.stream_stream(f"/{SERVICE}/{STREAM}")()
            for _ in range(messages):
                await call.write(request)
                await call.read()
            await end_stream(call, stream_end, 0.002)

        async def run(n: int) -> None:
            for _ in range(0, n, 50):
                await asyncio.gather(*(one() for _ in range(50)))
            await asyncio.sleep(0.5)

        async def measure() -> tuple[int, int]:
            heap, blocks = (await stats(b"")).split()
            return int(heap), int(blocks)

        await run(WARMUP)
        heap0, blocks0 = await measure()
        step, done, last = streams // steps, 0, heap0
        heap1, blocks1 = heap0, blocks0
        for _ in range(steps):
            if new_connection_each_step:
                await streams_channel.close()
                streams_channel = grpc.aio.insecure_channel(target)
            await run(step)
            done += step
            heap1, blocks1 = await measure()
            if steps > 1:
                print(f"| {done:,} | {(heap1 - heap0) / 1024:.0f} | {(heap1 - last) / step:.1f} | "
                      f"{blocks1 - blocks0:+d} |", flush=True)
            last = heap1
        if new_connection_each_step:
            await streams_channel.close()
    return (heap1 - heap0) / done, (blocks1 - blocks0) / done


def measure_case(handler_end: str, stream_end: str, streams: int, work: Path, loop: str,
                 steps: int = 1, messages: int = 1, size: int = 140,
                 new_connection_each_step: bool = False) -> tuple[float, float]:
    port_file = work / f"port-{handler_end}-{stream_end}"
    port_file.unlink(missing_ok=True)
    server = subprocess.Popen([sys.executable, "-m", "research.probes.stream_leak", "--loop", loop,
                               "--serve", handler_end, str(port_file)])
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text()):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the leak server did not start")
            time.sleep(0.05)
        return asyncio.run(drive(int(port_file.read_text()), stream_end, streams, steps, messages, size,
                                 new_connection_each_step))
    finally:
        server.terminate()
        server.wait(10)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=6000)
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                   help="the server's event loop (the sidecar runs on uvloop when it is installed)")
    p.add_argument("--curve", choices=("eof", "cancel"), help="one case, the growth after every step")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--messages", type=int, default=1, help="round trips per stream")
    p.add_argument("--size", type=int, default=140, help="bytes of each client message")
    p.add_argument("--new-connection-each-step", action="store_true",
                   help="with --curve: each step's streams on a fresh connection, the previous one closed")
    p.add_argument("--serve", nargs=2, metavar=("HANDLER_END", "PORT_FILE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve[0], Path(args.serve[1]), args.loop == "uvloop")
        return
    work = Path("/tmp") / f"stream-leak-{time.time_ns()}"
    work.mkdir(parents=True)
    if args.curve:
        print(f"grpcio {grpc.__version__}, server on {args.loop}, the sidecar's handler, the client ends by "
              f"{args.curve}; {args.messages} round trips of {args.size} B a stream, after {WARMUP} of warm-up\n")
        print("| streams | malloc heap kept (KiB) | B/stream over the last step | Python blocks kept |")
        print("|---:|---:|---:|---:|")
        measure_case(HANDLERS[-1], args.curve, args.streams, work, args.loop, max(1, args.steps), args.messages,
                     args.size, args.new_connection_each_step)
        return
    print(f"grpcio {grpc.__version__}, server on {args.loop}, {args.streams} streams per case after {WARMUP} of "
          "warm-up\n")
    print("| the client | the handler at EOF | malloc heap kept (B/stream) | Python blocks kept (per stream) |")
    print("|---|---|---:|---:|")
    for stream_end in ("eof", "cancel"):
        for handler_end in HANDLERS:
            heap, blocks = measure_case(handler_end, stream_end, args.streams, work, args.loop)
            print(f"| {stream_end} | {handler_end} | {heap:.1f} | {blocks:.2f} |", flush=True)


if __name__ == "__main__":
    main()
