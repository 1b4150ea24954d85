"""The sidecar's native heap per ext_proc stream, with a gRPC client in Envoy's place: does it keep memory?

    python -m research.probes.sidecar_stream_leak [--end cancel|eof] [--streams 24000] [--steps 4] [--no-tokenizer]
        [--memray FILE]

Starts the real sidecar (the tiny tokenizer, the approximate prefix source, a full collection and heap trim
every 3 s) and speaks the BUFFERED conversation to it as Envoy does, 32 streams at a time: request headers,
a unique soak prompt (bench/soak.py's bodies), response headers; then it cancels the stream (as Envoy resets
one) or half-closes it. After a warm-up of 8,000 streams it prints, `--steps` times, how much the sidecar's
RSS, its malloc heap ([heap] in smaps) and its live malloc bytes (loadaware_malloc_in_use_bytes) grew, per
stream (`--no-tokenizer`: a sidecar without one). No Envoy, engines or KV events: only the sidecar's ext_proc
path and grpc.aio.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from bench.extproc_inprocess import buffered_messages
from bench.soak import UNIQUE_MARKER, mapping_mb, rss_mb, soak_bodies
from research.probes.stream_leak import end_stream
from testkit.paths import TINY_TOKENIZER
from testkit.ports import free_port
from testkit.profiled import memray_sidecar
from testkit.sidecar import SidecarProc

WARMUP, CONCURRENCY, STEPS = 8000, 32, 4
METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
RESPONSE_HEADERS = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
    base_pb2.HeaderValue(key=":status", raw_value=b"200")])))


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


async def drive(sidecar: SidecarProc, port: int, end: str, streams: int, steps: int = STEPS) -> None:
    bodies = soak_bodies()
    sent = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        process = channel.stream_stream(METHOD, request_serializer=pb.ProcessingRequest.SerializeToString)

        async def one() -> None:
            nonlocal sent
            body = bodies[sent % len(bodies)].replace(UNIQUE_MARKER, str(sent)).encode()
            sent += 1
            call = process()
            for message in (*buffered_messages(body), RESPONSE_HEADERS):
                await call.write(message)
                await call.read()
            await asyncio.sleep(0.01)  # the sidecar waits in its read, as for the end of an HTTP request
            await end_stream(call, end, 0.0)

        async def run(n: int) -> None:
            slots = asyncio.Semaphore(CONCURRENCY)

            async def slot() -> None:
                async with slots:
                    await one()

            await asyncio.gather(*(slot() for _ in range(n)))

        async def measure() -> tuple[float, float, float]:
            await asyncio.sleep(4)  # a periodic collection and trim ran since the last stream
            live = metric(sidecar.metrics_text(), "loadaware_malloc_in_use_bytes") / 2**20
            return rss_mb(sidecar.pid), mapping_mb(sidecar.pid)[0], live

        await run(WARMUP)
        rss0, heap0, live0 = await measure()
        started, done = time.monotonic(), 0
        print(f"| streams ({end}) | RSS (MiB) | [heap] (MiB) | live malloc (MiB) | live B/stream | s |")
        print("|---:|---:|---:|---:|---:|---:|")
        for _ in range(steps):
            await run(streams // steps)
            done += streams // steps
            rss, heap, live = await measure()
            print(f"| {done} | {rss - rss0:+.1f} | {heap - heap0:+.1f} | {live - live0:+.2f} | "
                  f"{(live - live0) * 2**20 / done:.0f} | {time.monotonic() - started:.0f} |", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--end", choices=("cancel", "eof"), default="cancel")
    p.add_argument("--streams", type=int, default=24000)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--no-tokenizer", action="store_true", help="the sidecar without a tokenizer")
    p.add_argument("--memray", type=Path, default=None,
                   help="run the sidecar under memray, recording to this file (python -m research.probes.memray_run)")
    args = p.parse_args(argv)
    port = free_port()
    flags = ["--listen", f"127.0.0.1:{port}", "--endpoints", "127.0.0.2:8000,127.0.0.3:8000,127.0.0.4:8000",
             "--metrics-listen", f"127.0.0.1:{free_port()}",
             "--log-level", "warning", "--prefix-source", "approx", "--gc-full-interval-s", "3"]
    if not args.no_tokenizer:
        flags += ["--tokenizer", str(TINY_TOKENIZER)]
    command = memray_sidecar(args.memray) if args.memray else None
    with SidecarProc(flags, log_dir=Path("out") / "sidecar-stream-leak", command=command) as sidecar:
        asyncio.run(drive(sidecar, port, args.end, args.streams, max(1, args.steps)))


if __name__ == "__main__":
    main()
