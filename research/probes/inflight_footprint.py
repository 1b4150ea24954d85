"""What a request in flight costs the sidecar, and what a pile of them leaves resident after they end.

    python -m research.probes.inflight_footprint [--held 400] [--rounds 3]

Starts the real sidecar (the tiny tokenizer, the approximate prefix source, a full collection and heap trim every
3 s) and speaks the BUFFERED conversation to it as Envoy does: request headers and a unique soak prompt
(bench/soak.py's bodies), then the stream is held open without its response headers, as while an engine that
took the request has not answered (an engine that hangs: every request sent to it stays in flight). `--held`
streams at once; then they are cancelled, and the sidecar is read again once a collection and a trim ran. Each
round repeats that, with steady traffic between rounds (what a sidecar does between two incidents).

Per round it prints the sidecar's RSS, its malloc heap ([heap]), the rest of its anonymous pages (Python's
arenas; bench/soak.py, `anon_parts`) and its live malloc (loadaware_malloc_in_use_bytes) before, while the
streams are held, and after: the bytes a held request costs, and what a pile of them leaves resident once
gone (a second round of the same size that adds nothing means the pile's pages are reused: a plateau at the
largest pile, not a leak). No Envoy, engines or KV events: only the sidecar's ext_proc path and grpc.aio.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from bench.extproc_inprocess import buffered_messages
from bench.soak import UNIQUE_MARKER, anon_parts, mapping_mb, rss_mb, soak_bodies
from research.probes.sidecar_stream_leak import METHOD, RESPONSE_HEADERS, metric
from testkit.paths import TINY_TOKENIZER
from testkit.ports import free_port
from testkit.sidecar import SidecarProc

STEADY = 4000  # streams run to their end between rounds (and before the first), 32 at a time
CONCURRENCY = 32
SETTLE_S = 4.0  # a periodic collection and trim (every 3 s here) ran since the last change


class Reading:
    def __init__(self, sidecar: SidecarProc) -> None:
        pid = sidecar.pid
        self.rss = rss_mb(pid)
        self.heap = mapping_mb(pid)[0]
        _, _, self.rest = anon_parts(pid)
        text = sidecar.metrics_text()
        self.live = metric(text, "loadaware_malloc_in_use_bytes") / 2**20
        self.blocks = metric(text, "loadaware_python_allocated_blocks")

    def minus(self, other: Reading) -> str:
        return (f"RSS {self.rss - other.rss:+6.1f} | [heap] {self.heap - other.heap:+5.1f} | "
                f"rest {self.rest - other.rest:+5.1f} | live malloc {self.live - other.live:+5.2f} MiB | "
                f"blocks {self.blocks - other.blocks:+8,.0f}")


async def drive(sidecar: SidecarProc, port: int, held: int, rounds: int) -> None:
    bodies = soak_bodies()
    sent = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        process = channel.stream_stream(METHOD, request_serializer=pb.ProcessingRequest.SerializeToString)

        async def open_stream() -> Any:
            nonlocal sent
            body = bodies[sent % len(bodies)].replace(UNIQUE_MARKER, str(sent)).encode()
            sent += 1
            call = process()
            for message in buffered_messages(body):
                await call.write(message)
                await call.read()
            return call

        async def whole() -> None:
            call = await open_stream()
            await call.write(RESPONSE_HEADERS)
            await call.read()
            call.cancel()

        async def steady(n: int) -> None:
            slots = asyncio.Semaphore(CONCURRENCY)

            async def slot() -> None:
                async with slots:
                    await whole()

            await asyncio.gather(*(slot() for _ in range(n)))

        async def settled() -> Reading:
            await asyncio.sleep(SETTLE_S)
            return Reading(sidecar)

        await steady(STEADY)
        first = await settled()
        for k in range(rounds):
            before = await settled()
            calls: list[Any] = []
            for _ in range(held // CONCURRENCY + 1):
                calls += await asyncio.gather(*(open_stream() for _ in range(min(CONCURRENCY, held - len(calls)))))
            during = await settled()
            print(f"round {k + 1}: held at unix {time.time():.1f}", flush=True)
            for call in calls:
                call.cancel()
            del calls
            await steady(STEADY // 4)  # the pile gone, traffic goes on
            after = await settled()
            per = (during.rss - before.rss) * 2**20 / held
            print(f"round {k + 1}: {held} held | while held: {during.minus(before)} | {per / 1024:.1f} KiB RSS each",
                  flush=True)
            print(f"round {k + 1}: after           : {after.minus(before)}", flush=True)
            print(f"round {k + 1}: since the start : {after.minus(first)}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--held", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sidecar-args", default="", help="more sidecar flags, one string (e.g. a tracemalloc folder)")
    args = p.parse_args(argv)
    port = free_port()
    flags = ["--listen", f"127.0.0.1:{port}", "--endpoints", "127.0.0.2:8000,127.0.0.3:8000,127.0.0.4:8000",
             "--metrics-listen", f"127.0.0.1:{free_port()}", "--tokenizer", str(TINY_TOKENIZER),
             "--log-level", "warning", "--prefix-source", "approx", "--gc-full-interval-s", "3",
             *args.sidecar_args.split()]
    with SidecarProc(flags, log_dir=Path("out") / "inflight-footprint") as sidecar:
        asyncio.run(drive(sidecar, port, args.held, max(1, args.rounds)))


if __name__ == "__main__":
    main()
