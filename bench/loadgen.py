"""Open-loop HTTP load generator (asyncio + aiohttp), meant to run in its own process.

Requests are launched at their scheduled times whether or not earlier ones have finished (open loop), over
a bounded keep-alive connection pool; a request waiting for a free connection keeps its scheduled time, so
latency is measured from when it was *due* (no coordinated omission). Bounded by count and by time: the
schedule ends at `duration`, and whatever is still running `drain_timeout` later counts as an error.

With `stream` (SSE responses, `"stream": true` bodies) a 200 response is read piece by piece as it arrives:
its events are counted (bench/sse.py), the time to its first complete event is its TTFT (from the due time,
like the latency, which still runs to the last byte), and a body that does not end with `data: [DONE]` is an
error ("error:truncated_stream").

    python -m bench.loadgen SPEC.json OUT.json
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from .schedule import arrival_offsets
from .sse import SseCounter


@dataclass
class LoadSpec:
    url: str
    rate: float
    duration: float
    method: str = "POST"
    bodies: list[str] = field(default_factory=list)  # cycled; empty: no body (GET)
    bodies_file: str = ""  # JSON list of strings, appended to `bodies`
    arrivals: str = "poisson"
    seed: int = 1
    max_requests: int | None = None
    connections: int = 256
    timeout: float = 10.0  # per request, total
    drain_timeout: float = 15.0
    stream: bool = False  # read 200 responses as SSE streams: count events, time the first one
    # Client hang-ups: this share of requests (seeded choice) is abandoned after a uniform random wait in
    # [0, hangup_within_s): the connection closes mid-request, as a client giving up does (status "hangup").
    hangup_fraction: float = 0.0
    hangup_within_s: float = 0.2
    # Each occurrence of this string in a body is replaced by the request's own number: every prompt unique.
    unique_marker: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadSpec:
        return cls(**data)


@dataclass
class LoadResult:
    offered_rate: float
    duration: float
    scheduled: int
    sent: int
    ok: int
    errors: int
    statuses: dict[str, int]  # "200": n, "error:timeout": n, ...
    latencies_s: list[float]  # from the due time, successful (2xx) requests only
    service_s: list[float]  # from the actual send, successful requests only
    send_lag_p99_ms: float  # how late the generator itself was launching requests
    wall_s: float  # from the first due time to the last completion
    achieved_rate: float  # ok / max(duration, wall_s)
    client_cpu_s: float
    ttft_s: list[float] = field(default_factory=list)  # stream: due time to first event, successful requests
    sse_events: dict[str, int] = field(default_factory=dict)  # stream: {events per response: responses}
    hangups: int = 0  # requests the client abandoned on purpose (spec.hangup_fraction), not counted as errors

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadResult:
        return cls(**data)


def _load_bodies(spec: LoadSpec) -> list[bytes | None]:
    texts = list(spec.bodies)
    if spec.bodies_file:
        texts += json.loads(Path(spec.bodies_file).read_text())
    return [t.encode() for t in texts] if texts else [None]


def hangup_delays(n: int, fraction: float, within_s: float, seed: int) -> dict[int, float]:
    """Which of `n` requests the client abandons, and after how long: a seeded choice of round(n * fraction)."""
    if fraction <= 0 or n == 0:
        return {}
    rng = random.Random(seed * 7919 + 17)
    chosen = rng.sample(range(n), min(n, round(n * fraction)))
    return {i: rng.uniform(0.0, within_s) for i in sorted(chosen)}


async def run_load(spec: LoadSpec) -> LoadResult:
    offsets = arrival_offsets(spec.rate, spec.duration, arrivals=spec.arrivals, seed=spec.seed,
                              max_requests=spec.max_requests)
    bodies = _load_bodies(spec)
    n = len(offsets)
    status: list[str] = ["error:not_sent"] * n
    latency = [math.nan] * n
    service = [math.nan] * n
    lag = [math.nan] * n
    ends = [math.nan] * n
    ttft = [math.nan] * n
    events = [0] * n
    headers = {"content-type": "application/json"} if bodies[0] is not None else {}
    hangups = hangup_delays(n, spec.hangup_fraction, spec.hangup_within_s, spec.seed)
    marker = spec.unique_marker.encode()
    cpu0 = time.process_time()
    connector = aiohttp.TCPConnector(limit=spec.connections, limit_per_host=spec.connections,
                                     ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=spec.timeout)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(i: int, due: float) -> None:
            body = bodies[i % len(bodies)]
            if marker and body is not None:
                body = body.replace(marker, str(i).encode())
            started = loop.time()
            lag[i] = started - due
            try:
                async with asyncio.timeout(hangups.get(i)), \
                        session.request(spec.method, spec.url, data=body, headers=headers) as resp:
                    if spec.stream and resp.status == 200:
                        sse = SseCounter()
                        async for piece in resp.content.iter_any():
                            if sse.feed(piece) and math.isnan(ttft[i]):
                                ttft[i] = loop.time() - due
                        events[i] = sse.events
                        status[i] = "200" if sse.done else "error:truncated_stream"
                    else:
                        await resp.read()
                        status[i] = str(resp.status)
            except TimeoutError:
                status[i] = "hangup" if i in hangups else "error:timeout"
            except aiohttp.ClientError as exc:
                status[i] = f"error:{type(exc).__name__}"
            except asyncio.CancelledError:
                status[i] = "error:unfinished"
                raise
            end = loop.time()
            ends[i] = end
            latency[i] = end - due
            service[i] = end - started

        t0 = loop.time() + 0.02
        tasks: list[asyncio.Task[None]] = []
        for i, off in enumerate(offsets):
            due = t0 + off
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, due)))
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=spec.drain_timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2.0)
    ok_idx = [i for i in range(n) if status[i].isdigit() and 200 <= int(status[i]) < 300]
    hung_up = sum(1 for i in hangups if status[i] == "hangup")
    finished = [e for e in ends if not math.isnan(e)]
    wall = (max(finished) - t0) if finished else 0.0
    lags = sorted(x for x in lag if not math.isnan(x))
    lag_p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))] * 1e3 if lags else math.nan
    return LoadResult(
        offered_rate=spec.rate, duration=spec.duration, scheduled=n,
        sent=sum(1 for x in lag if not math.isnan(x)), ok=len(ok_idx), errors=n - len(ok_idx) - hung_up,
        statuses=dict(Counter(status)), latencies_s=[latency[i] for i in ok_idx],
        service_s=[service[i] for i in ok_idx], send_lag_p99_ms=lag_p99, wall_s=wall,
        achieved_rate=len(ok_idx) / max(spec.duration, wall) if n else 0.0, hangups=hung_up,
        client_cpu_s=time.process_time() - cpu0,
        ttft_s=[ttft[i] for i in ok_idx] if spec.stream else [],
        sse_events=({str(k): v for k, v in sorted(Counter(events[i] for i in ok_idx).items())}
                    if spec.stream else {}),
    )


def _runner() -> Any:
    try:
        import uvloop

        return uvloop.run
    except ImportError:  # pragma: no cover
        return asyncio.run


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m bench.loadgen SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = LoadSpec.from_dict(json.loads(Path(args[0]).read_text()))
    result = _runner()(run_load(spec))
    Path(args[1]).write_text(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
