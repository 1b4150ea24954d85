"""Live memory per request through the sidecar's whole request path, in process: no Envoy, no network.

    python -m bench.memory_per_request [--requests 100000] [--checkpoints 20000,60000,100000]
        [--policy auto] [--sources kv-events,approx] [--tracemalloc] [--top 25] [--json]

Each request is the message sequence Envoy sends, fed to the ext_proc servicer's stream handler (as
bench/extproc_inprocess.py does), with the mix the soak carries and more: completions and chat, BUFFERED
(headers, body, response headers naming the engine that served) and full duplex (protocol_config, the body in
two chunks, response headers, a streamed response and its end), a session header on half of them (sessions of
four requests, new ones all the time), and a share of streams that end early: Envoy resets the stream while
the handler waits for a message (its task cancelled, the pending read completed with a failure, as grpc.aio
does), or a read fails because the call is gone. Prompts are the soak's shape: one of 64 shared prefixes,
then the request's number and a unique tail. With the kv-events source on, three simulated engines
(sim/prefix_cache.py) cache each routed prompt's blocks (the tokens the sidecar decided with) and their
changes reach the sidecar's own feeds as vLLM's KV-event batches (EngineFeed.on_message): decode, sequence,
index.

Every bound is set small (`BOUNDS`) and the warm-up runs until each is full, so what still grows after it is
growth per request, not a cache filling. At each checkpoint: a full collection and a heap trim, then glibc's
live malloc (mallinfo2, loadaware.collector.malloc_counts), Python's allocated blocks and, with --tracemalloc,
traced bytes and a snapshot; the growth per request between checkpoints, and the top allocation sites by
growth (tracebacks) between the first and the last.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import random
import sys
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc
import msgpack
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2
from grpc._cython import cygrpc

from bench.soak import soak_bodies
from loadaware.app import Sidecar
from loadaware.collector import heap_trimmer, malloc_counts
from loadaware.config import from_args
from loadaware.fleet.addresses import FeedAddress
from loadaware.lifecycle import Decision
from loadaware.prefix.kvevents.feeds import EngineFeed
from loadaware.prefix.sources.kv_events import KvEventsParts
from sim.fleet import DEFAULT_TOKENIZER as TINY_MODEL_DIR
from sim.prefix_cache import BlocksRemoved, BlocksStored, CacheEvent, PrefixCache

FLEET = ("127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000")
SESSION_HEADER = "x-session-id"
BS = 16
Mode = processing_mode_pb2.ProcessingMode

# Every bound small, so that the warm-up fills each one (flag -> value).
BOUNDS = {"--session-max-entries": "500", "--state-max-entries": "500", "--conversation-cache-mb": "1",
          "--approx-capacity-tokens": "20000", "--approx-max-blocks": "3000", "--kv-events-max-blocks": "4000"}
ENGINE_CACHE_BLOCKS = 1_024  # each simulated engine's prefix cache: it evicts, so removals flow too


@dataclass
class Mix:
    """Shares of the traffic (each request draws its kind independently)."""

    chat: float = 0.4
    duplex: float = 0.3
    session: float = 0.5
    reset: float = 0.06  # Envoy resets the stream while the handler waits for a message
    call_gone: float = 0.02  # a read fails: the call is gone
    response_chunks: int = 8  # full duplex: the streamed response's chunks before its end
    short: bool = False  # short prompts (the cheapest realistic path) instead of the soak's


@dataclass
class RigOptions:
    policy: str = "auto"
    sources: str = "kv-events,approx"  # "" = no prefix source, no tokenizer
    mix: Mix = field(default_factory=Mix)
    seed: int = 7
    flags: tuple[str, ...] = ()  # more of the sidecar's flags (after the rig's: they win)


def sidecar(options: RigOptions) -> Sidecar:
    flags = ["--endpoints", ",".join(FLEET), "--metrics-listen", "off", "--policy", options.policy,
             "--session-header", SESSION_HEADER, "--state-probe-timeout-s", "0.02"]
    for flag, value in BOUNDS.items():
        flags += [flag, value]
    if options.sources:
        flags += ["--tokenizer", str(TINY_MODEL_DIR), "--prefix-source", options.sources]
    if "kv-events" in options.sources:  # feeds the rig attaches itself (KvEngines), never dialled
        flags += ["--kv-events-endpoints", ",".join(f"{ep}=127.0.0.1:{9 + i}" for i, ep in enumerate(FLEET))]
    return Sidecar(from_args([*flags, *options.flags], environ={}))


# ---------------------------------------------------------------- the engines' KV events
def _encode(events: list[CacheEvent]) -> bytes:
    """One engine step's events as vLLM's KVEventBatch (msgspec array layout)."""
    out: list[Any] = []
    for event in events:
        if isinstance(event, BlocksStored):
            for run in _runs(event.blocks):
                out.append(["BlockStored", [b.key for b in run], run[0].parent, [t for b in run for t in b.tokens],
                            BS, None, "GPU", None])
        elif isinstance(event, BlocksRemoved):
            out.append(["BlockRemoved", list(event.keys), "GPU"])
    return bytes(msgpack.packb([time.time(), out, 0], use_bin_type=True))


def _runs(blocks: Sequence[Any]) -> list[list[Any]]:
    runs: list[list[Any]] = []
    for block in blocks:
        if not runs or block.parent != runs[-1][-1].key:
            runs.append([])
        runs[-1].append(block)
    return runs


class KvEngines:
    """Three simulated engines' prefix caches, each publishing to the sidecar's own feed of it: a lifecycle
    listener takes each routed prompt's tokens (copied: the decision keeps no reference of the rig's), and
    `publish()` hands each engine's step to its feed as a published message."""

    def __init__(self, app: Sidecar) -> None:
        parts = app.prefixes.part("kv-events", KvEventsParts)
        assert parts is not None
        self.feeds: dict[str, EngineFeed] = {}
        self.caches: dict[str, PrefixCache] = {}
        self.pending: dict[str, list[CacheEvent]] = {}
        self.seq: dict[str, int] = {}
        for ep in FLEET:
            feed = EngineFeed(ep, FeedAddress(f"tcp://{ep}", None), parts.feeds.shared, "")
            feed.connected = feed.synced = True
            feed.sync.applied(-1, True)  # as after its join: the next batch (0) follows
            parts.feeds.attach(ep, [feed])
            cache = self.caches[ep] = PrefixCache(ENGINE_CACHE_BLOCKS, BS)
            cache.add_observer(self.pending.setdefault(ep, []).append)
            self.feeds[ep], self.seq[ep] = feed, 0
        self._routed: list[tuple[str, list[int]]] = []
        app.lifecycle.subscribe(self)

    def on_decided(self, decision: Decision) -> None:
        if decision.endpoint in self.caches and decision.tokens:
            self._routed.append((decision.endpoint, list(decision.tokens)))

    def on_served(self, decision: Decision, previous: str | None) -> None:
        pass

    def on_ended(self, decision: Decision) -> None:
        pass

    async def publish(self) -> None:
        routed, self._routed = self._routed, []
        for ep, tokens in routed:
            self.caches[ep].insert(tokens)
        for ep, events in self.pending.items():
            if events:
                payload = _encode(events)
                events.clear()
                seq = self.seq[ep]
                self.seq[ep] = seq + 1
                await self.feeds[ep].on_message([b"", seq.to_bytes(8, "big"), payload])


# ---------------------------------------------------------------- the requests
def _headers(items: Sequence[tuple[str, str]]) -> Any:
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in items]))


class Traffic:
    """Request i's messages: its kind drawn from the mix, its prompt the soak's shape, its own number in it."""

    def __init__(self, mix: Mix, seed: int) -> None:
        self.mix = mix
        self.rng = random.Random(seed)
        bodies = [json.loads(b) for b in soak_bodies(prefixes=64, per_prefix=1)]
        heads = [b["prompt"].split(" request ")[0] for b in bodies]
        self.heads = [h[:120] for h in heads] if mix.short else heads
        words = ("year", "model", "against", "token", "could", "other", "request", "came", "old", "should", "there")
        self.tails = [" ".join(self.rng.choice(words) for _ in range(30 if not mix.short else 6))
                      for _ in range(257)]
        self.event = (b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" tok"}]}'
                      b"\n\n")

    def body(self, i: int, chat: bool) -> bytes:
        head, tail = self.heads[i % len(self.heads)], f"request {i} {self.tails[i % 257]}"
        if chat:
            return json.dumps({"model": "m", "max_tokens": 4, "messages": [
                {"role": "system", "content": head}, {"role": "user", "content": tail}]}).encode()
        return json.dumps({"model": "m", "max_tokens": 4, "prompt": f"{head} {tail}"}).encode()

    def request(self, i: int) -> tuple[list[Any], int | None, str]:
        """The messages, the index of the read at which the stream ends early (None: EOF), and how."""
        rng, mix = self.rng, self.mix
        chat = rng.random() < mix.chat
        items = [(":method", "POST"), (":path", "/v1/chat/completions" if chat else "/v1/completions"),
                 ("x-request-id", f"req-{i}")]
        if rng.random() < mix.session:
            items.append((SESSION_HEADER, f"session-{i // 8}"))  # ~4 requests a session, new ones all the time
        body = self.body(i, chat)
        if rng.random() < mix.duplex:
            config = pb.ProtocolConfiguration(request_body_mode=Mode.FULL_DUPLEX_STREAMED,
                                              response_body_mode=Mode.FULL_DUPLEX_STREAMED)
            half = len(body) // 2
            msgs = [pb.ProcessingRequest(request_headers=_headers(items), protocol_config=config),
                    pb.ProcessingRequest(request_body=pb.HttpBody(body=body[:half])),
                    pb.ProcessingRequest(request_body=pb.HttpBody(body=body[half:], end_of_stream=True)),
                    RESPONSE_HEADERS,
                    *[pb.ProcessingRequest(response_body=pb.HttpBody(body=self.event))
                      for _ in range(mix.response_chunks)],
                    pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: [DONE]\n\n", end_of_stream=True))]
        else:
            msgs = [pb.ProcessingRequest(request_headers=_headers(items)),
                    pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
                    RESPONSE_HEADERS]
        r = rng.random()
        if r < mix.reset + mix.call_gone:
            return msgs, rng.randrange(1, len(msgs) + 1), "reset" if r < mix.reset else "call_gone"
        return msgs, None, ""


RESPONSE_HEADERS = object()  # stands for the response headers: built when read, naming the engine chosen


def response_headers(served: str | None) -> Any:
    msg = pb.ProcessingRequest(response_headers=_headers([(":status", "200")]))
    if served is not None:
        struct = struct_pb2.Struct()
        struct.update({"x-gateway-destination-endpoint-served": served})
        msg.metadata_context.filter_metadata["envoy.lb"].CopyFrom(struct)
    return msg


class Feed:
    """A stand-in for grpc.aio's servicer context. At `end_at` (a read's index) the stream ends early: "reset"
    leaves that read pending until the rig cancels the handler and fails it (gRPC completes a cancelled call's
    pending batches); "call_gone" fails the read at once."""

    def __init__(self, messages: list[Any], served: Any, end_at: int | None = None, how: str = "") -> None:
        self._messages = messages
        self._served = served  # () -> the engine the proxy reports as having served
        self._next = 0
        self._end_at, self._how = end_at, how
        self._cancelled = False
        self.hung: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending: asyncio.Future[Any] | None = None

    async def read(self) -> Any:
        i = self._next
        self._next += 1
        if i == self._end_at:
            if self._how == "call_gone":
                raise cygrpc.ExecuteBatchError("Failed \"execute_batch\"")
            self._pending = asyncio.get_running_loop().create_future()
            self.hung.set_result(None)
            return await self._pending
        if i >= len(self._messages):
            return grpc.aio.EOF
        msg = self._messages[i]
        return response_headers(self._served()) if msg is RESPONSE_HEADERS else msg

    async def write(self, reply: bytes) -> None:
        pass

    def cancelled(self) -> bool:
        return self._cancelled

    def reset(self) -> None:
        self._cancelled = True
        if self._pending is not None and not self._pending.done():
            self._pending.set_exception(cygrpc.ExecuteBatchError("Failed \"execute_batch\""))


class Rig:
    """One sidecar and its traffic; `run(n)` sends the next n requests, one stream at a time."""

    def __init__(self, options: RigOptions) -> None:
        self.options = options
        self.app = sidecar(options)
        self.traffic = Traffic(options.mix, options.seed)
        self.engines = KvEngines(self.app) if "kv-events" in options.sources else None
        self.sent = 0
        self.ends = {"eof": 0, "reset": 0, "call_gone": 0}
        self._last: Decision | None = None
        self.app.lifecycle.subscribe(self)

    def on_decided(self, decision: Decision) -> None:
        self._last = decision

    def on_served(self, decision: Decision, previous: str | None) -> None:
        pass

    def on_ended(self, decision: Decision) -> None:
        self._last = None

    def _served(self) -> str | None:
        return self._last.endpoint if self._last is not None else None

    async def one(self, i: int) -> None:
        messages, end_at, how = self.traffic.request(i)
        feed = Feed(messages, self._served, end_at, how)
        task = asyncio.ensure_future(self.app.extproc.process(None, feed))
        await asyncio.wait((task, feed.hung), return_when=asyncio.FIRST_COMPLETED)
        if not task.done():  # waiting in the read Envoy's reset ends
            feed.reset()
            task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        self.ends[how or "eof"] += 1
        if self.engines is not None:
            await self.engines.publish()

    async def run(self, n: int) -> None:
        for _ in range(n):
            await self.one(self.sent)
            self.sent += 1

    def in_flight(self) -> int:
        return int(self.app.loads.total())

    def fill(self) -> dict[str, Any]:
        """How full each bounded structure is: every bound reached after the warm-up, or the run says not."""
        app = self.app
        out: dict[str, Any] = {}
        stickiness = app.decider.stickiness
        if stickiness is not None:
            out["sessions"] = len(stickiness.affinity)
        out["state_holders"] = len(app.state_holders)
        out["recent_decisions"] = len(app.recent.items)
        tok = app.tokenizer
        if tok is not None:
            out["piece_cache_tokens"] = tok.tokenizer.pieces.cached_tokens
            if tok.conversations is not None:
                out["conversations"] = tok.conversations.cache.counts()
        prefixes = app.prefixes.state()
        for name in ("kv_events", "approx"):
            part = prefixes.get(name)
            if isinstance(part, dict):
                out[name] = {k: part[k] for k in ("total_blocks", "max_blocks") if k in part}
        return out

    def close(self) -> None:
        if self.app.tokenizer is not None:
            self.app.tokenizer.close()


# ---------------------------------------------------------------- measuring
class Meter:
    """Live memory after a full collection and a heap trim: malloc in use (glibc), Python's allocated blocks,
    and tracemalloc's traced bytes when it traces."""

    def __init__(self) -> None:
        self._trim = heap_trimmer()
        self._malloc = malloc_counts()

    def read(self) -> dict[str, int]:
        gc.collect()
        if self._trim is not None:
            self._trim()
        out = {"py_blocks": sys.getallocatedblocks()}
        if self._malloc is not None:
            out["malloc_in_use"] = self._malloc()[0]
        if tracemalloc.is_tracing():
            out["traced"] = tracemalloc.get_traced_memory()[0]
        return out


MEASURES = ("malloc_in_use", "py_blocks", "traced")


def per_request(a: dict[str, int], b: dict[str, int], requests: int) -> dict[str, float]:
    return {k: (b[k] - a[k]) / requests for k in MEASURES if k in a and k in b}


def top_growth(first: tracemalloc.Snapshot, last: tracemalloc.Snapshot, requests: int, top: int) -> list[str]:
    stats = last.compare_to(first, "traceback")
    lines = []
    for stat in sorted(stats, key=lambda s: -s.size_diff)[:top]:
        if stat.size_diff <= 0:
            break
        frames = " <- ".join(f"{f.filename.split('site-packages/')[-1].split('/work/main/')[-1]}:{f.lineno}"
                             for f in reversed(stat.traceback[-6:]))  # the allocating frame first
        lines.append(f"{stat.size_diff / requests:+8.2f} B/req {stat.count_diff:+7d} blocks  {frames}")
    return lines


async def measure(options: RigOptions, checkpoints: Sequence[int], trace: bool = False, top: int = 25,
                  frames: int = 12, listener: Any = None) -> dict[str, Any]:
    """Runs to each checkpoint (the first one is the warm-up) and reads the meter there. `listener`: one more
    lifecycle listener on the sidecar (a test's deliberate leak)."""
    if trace:
        tracemalloc.start(frames)
    rig = Rig(options)
    if listener is not None:
        rig.app.lifecycle.subscribe(listener)
    meter = Meter()
    samples: list[dict[str, Any]] = []
    snaps: list[tracemalloc.Snapshot] = []
    started = time.process_time()
    try:
        for n in checkpoints:
            await rig.run(n - rig.sent)
            samples.append({"requests": rig.sent, "cpu_s": round(time.process_time() - started, 1), **meter.read(),
                            "fill": rig.fill()})
            if trace:
                snaps.append(tracemalloc.take_snapshot())
            print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
    finally:
        rig.close()
        if trace:
            tracemalloc.stop()
    out: dict[str, Any] = {"options": asdict(options), "samples": samples, "ends": rig.ends, "fill": rig.fill(),
                           "in_flight_after": rig.in_flight(),
                           "slopes": [per_request(a, b, b["requests"] - a["requests"])
                                      for a, b in itertools.pairwise(samples)]}
    if len(samples) > 1:
        out["after_warmup"] = per_request(samples[0], samples[-1], samples[-1]["requests"] - samples[0]["requests"])
    if trace and len(snaps) > 1:
        out["top_growth"] = top_growth(snaps[0], snaps[-1], samples[-1]["requests"] - samples[0]["requests"], top)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.memory_per_request", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", default="20000,60000,100000")
    ap.add_argument("--policy", default="auto")
    ap.add_argument("--sources", default="kv-events,approx")
    ap.add_argument("--short", action="store_true", help="short prompts")
    ap.add_argument("--reset", type=float, default=Mix.reset)
    ap.add_argument("--duplex", type=float, default=Mix.duplex)
    ap.add_argument("--chat", type=float, default=Mix.chat)
    ap.add_argument("--session", type=float, default=Mix.session)
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--frames", type=int, default=12, help="traceback depth with --tracemalloc")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--flags", default="", help="more sidecar flags, space-separated")
    args = ap.parse_args(argv)
    mix = Mix(chat=args.chat, duplex=args.duplex, session=args.session, reset=args.reset, short=args.short)
    options = RigOptions(args.policy, args.sources, mix, flags=tuple(args.flags.split()))
    checkpoints = [int(x) for x in args.checkpoints.split(",")]
    result = asyncio.run(measure(options, checkpoints, args.tracemalloc, args.top, args.frames))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"ends: {result['ends']}, in flight after: {result['in_flight_after']}")
    print(f"fill: {json.dumps(result['fill'])}")
    for s, slope in zip(result["samples"][1:], result["slopes"]):
        print(f"to {s['requests']:>7,}: " + ", ".join(f"{k} {v:+.2f}/req" for k, v in slope.items()))
    if "after_warmup" in result:
        print("after warm-up: " + ", ".join(f"{k} {v:+.2f}/req" for k, v in result["after_warmup"].items()))
    for line in result.get("top_growth", []):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
