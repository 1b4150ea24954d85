"""Fleet size: what 100, 1,000 and 10,000 endpoints cost a decision, Explain, /metrics and /debug/*, and how
long each holds the event loop.

    python -m bench.fleet_size [--quick] [--json] [--sizes 100,1000,10000] [--baseline GIT_REF] [--policy P]
                               [--learned] [--busy] [--full-scan] [--all-queueing] [--ops metrics_render,...]

`--policy` (default `loadaware`, the default policy): the policy deciding. `loadaware`, `kvaware`, `leastload`
and `banded` (with its candidates' token signals) score only a large pool's prefix holders and least-loaded
endpoints; `lane-spread` scans the pool by load until its cost floor
passes the best costs found (routing/pruning.py). `--learned`: every endpoint first learns its TTFT prices from
a few first chunks, within 20% of the prior's (as on the response path; a BUFFERED sidecar keeps the prior's),
which lowers lane-spread's floor. `--busy`: `--learned`, and every endpoint also has a fresh scrape (a simulated
engine's page, kept fresh for the whole run) and a response seen, so /metrics carries every per-endpoint series
a busy fleet has (routing state, decisions, responses, in-flight, scraped gauges, token signals, models, the
picker's per-pod queue). `--ops`: only these calls (and always the idle floor). `--full-scan`: the decider
scores every endpoint (its load order off), what the pruning saves. `--all-queueing`: every engine's scrape
shows an admission queue, so lane-spread chooses as loadaware after checking that every endpoint of the pool
queues (its worst case). `--baseline` measures the other commit with `loadaware` (and this run's `--busy` and
`--ops`).

One sidecar per size, in this process, on static endpoints that are never contacted (the engines are not
there: the scraper and the models poller are replaced by idle tasks, and every engine is recorded as
serving model "m", the requests' model, as a single-model fleet's lists say). Prefix source: the approximate
index, warmed by routing prompts of 32 shared prefixes, and 500 of those requests are left open so loads
differ. Measured per size:

- a decision in process (`Decider.decide`, counted, then ended) and through gRPC (one BUFFERED ext_proc
  conversation: headers, body, the choice), wall time per request;
- Explain over gRPC, `/metrics`, `/debug/state`, `/debug/decisions` (the default 50), wall time per call;
- `/metrics` rendered in process (`metrics_render`): the page's own coroutine, as the HTTP handler awaits it
  (refreshing the gauges read at render time and writing the text in a worker thread), without the HTTP
  transfer; wall time, and the render thread's CPU in brackets. With `--busy`, every engine is scraped again
  with another load and requests come and go between two renders, as between two scrapes of a busy fleet
  (the HTTP calls that follow see no change between them);
- the event loop's lag while each of them runs: a ticker task on the loop sleeps 1 ms and records how late
  it woke (max and p99). The clients run in a worker thread, so the loop is free for the ticker unless the
  sidecar's own work holds it, or the GIL and the OS keep the loop's thread from running (on a busy box a
  CPU-bound thread in the process costs the loop tens of ms by itself: the `idle` and `busy_thread` rows
  measure that floor);
- the periodic full collection (`--gc-full-interval-s`, on the loop) after all that, the heap settled as the
  CLI settles it once the sidecar is built (`cli.settle_heap`: start-up's objects frozen, the young threshold
  raised), so a collection walks what came after start, as in production;
- how long the sidecar's code held the loop: the CPU time of the longest loop callback (and the p99) in
  each window, read with `time.thread_time` around every callback, so neither the OS taking the CPU away
  nor a thread holding the GIL counts, only work done on the loop.

`--baseline REF` runs the same measurement on another commit of the project (exported with `git archive`
into a temporary folder, this file copied in) in a subprocess, and prints both side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import os
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

from loadaware.api.v1 import loadaware_pb2 as pb
from loadaware.api.v1 import loadaware_pb2_grpc as pb_grpc
from loadaware.app import Sidecar
from loadaware.cli import settle_heap
from loadaware.config import from_args
from loadaware.fleet.models import ServedModels
from loadaware.lifecycle import Decision
from loadaware.load.tracker import EngineStats
from loadaware.policies import Candidate
from loadaware.policies.ttft_model import TtftPrior
from loadaware.routing.request import parse_body
from sim.metrics import EngineMetrics

SIZES = (100, 1_000, 10_000)
PREFIXES = 32
OPEN_REQUESTS = 500
TICK_S = 0.001
OPS = ("idle", "busy_thread", "decide", "grpc_decide", "explain", "metrics_render", "metrics", "debug_state",
       "debug_decisions", "full_gc")
REPO = Path(__file__).resolve().parents[1]
LESSONS = 3  # first chunks each endpoint learns its prices from (--learned)
LEARNED_SPREAD = 0.2


def fleet(n: int) -> list[str]:
    """n distinct addresses nobody listens on (the sidecar never connects to them in this case)."""
    return [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:8000" for i in range(1, n + 1)]


def prompt(family: int, i: int) -> str:
    head = f"System {family}: you are assistant number {family}, answer briefly and precisely. " * 8
    return f"{head}Question {i}: what is {i} plus {family}?"


def body(family: int, i: int) -> bytes:
    return json.dumps({"model": "m", "prompt": prompt(family, i), "max_tokens": 1}).encode()


class Ticker:
    """Wakes every TICK_S on the loop and records how late each wake-up was."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + TICK_S
            await asyncio.sleep(TICK_S)
            self.samples.append(max(0.0, loop.time() - due))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def window(self) -> list[float]:
        out, self.samples = self.samples, []
        return out


class Holds:
    """The loop thread's CPU time in each loop callback (asyncio's Handle._run, timer handles included)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._original: Callable[[asyncio.Handle], None] | None = None

    def install(self) -> None:
        original = self._original = asyncio.Handle._run
        samples = self.samples

        def timed(handle: asyncio.Handle) -> None:
            started = time.thread_time()
            try:
                original(handle)
            finally:
                samples.append(time.thread_time() - started)

        setattr(asyncio.Handle, "_run", timed)  # noqa: B010 - a method replaced on the class, for the bench

    def uninstall(self) -> None:
        if self._original is not None:
            setattr(asyncio.Handle, "_run", self._original)  # noqa: B010

    def window(self) -> list[float]:
        out = self.samples[:]
        self.samples.clear()
        return out


class FullCollections:
    """Wall time of each full (generation 2) garbage collection, whichever thread ran it."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.samples.append(time.perf_counter() - self._started)

    def install(self) -> None:
        gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def window(self) -> list[float]:
        out = self.samples[:]
        self.samples.clear()
        return out


def spin(seconds: float) -> int:
    end, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        n += 1
    return n


def figures(times: Sequence[float], lags: Sequence[float], holds: Sequence[float] = (),
            collections: Sequence[float] = ()) -> dict[str, float]:
    ordered = sorted(lags) or [0.0]
    held = sorted(holds) or [0.0]
    return {"full_gc_n": len(collections), "full_gc_max_ms": max(collections, default=0.0) * 1e3,
            "hold_max_ms": held[-1] * 1e3, "hold_p99_ms": held[min(len(held) - 1, int(len(held) * 0.99))] * 1e3,
            "n": len(times), "mean_ms": statistics.fmean(times) * 1e3 if times else 0.0,
            "p50_ms": statistics.median(times) * 1e3 if times else 0.0,
            "max_ms": max(times) * 1e3 if times else 0.0,
            "lag_max_ms": ordered[-1] * 1e3,
            "lag_p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3}


async def idle() -> None:
    await asyncio.Event().wait()


def headers_message(request_id: str) -> ext_pb.ProcessingRequest:
    hs = [(":method", "POST"), (":path", "/v1/completions"), ("x-request-id", request_id)]
    return ext_pb.ProcessingRequest(request_headers=ext_pb.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs])))


def route_once(stub: ext_grpc.ExternalProcessorStub, request_id: str, payload: bytes) -> None:
    """One BUFFERED conversation as Envoy holds it; returns once the body's reply (the choice) arrived."""
    replies: queue.Queue[object] = queue.Queue()

    def requests() -> Iterator[ext_pb.ProcessingRequest]:
        yield headers_message(request_id)
        replies.get(timeout=120)
        yield ext_pb.ProcessingRequest(request_body=ext_pb.HttpBody(body=payload, end_of_stream=True))
        replies.get(timeout=120)

    for reply in stub.Process(requests(), timeout=120):
        replies.put(reply)


def timed(call: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return out


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=600) as resp:
        return bytes(resp.read())


def teach_prices(app: Sidecar, rng: random.Random, spread: float = LEARNED_SPREAD, respond: bool = False) -> None:
    """Each endpoint's prefill clock learns from LESSONS first chunks, as on the response path, at TTFTs the
    prior predicts times a factor drawn once per endpoint in [1 - spread, 1 + spread]: a fleet whose learned
    prices differ a little, as same-model engines' do. The lessons are dated in the past (the signal tracker's
    clock is set back while they are given), so every clock is idle afterwards. `respond`: the last lesson's
    response headers are seen too (status 200), as the response path reports them."""
    signals = app.signals
    real = signals.clock
    start = real() - 10.0 * (LESSONS + 2)
    prior = TtftPrior()
    try:
        for ep in app.registry.snapshot():
            factor = rng.uniform(1 - spread, 1 + spread)
            for k in range(LESSONS):
                uncached = 200 + 400 * k
                at = start + 10.0 * k
                d = Decision(f"lesson-{ep}-{k}", ep, "routed", (), uncached, (Candidate(ep, 0, 0.0),), (0.0,), {},
                             0.0)
                signals.clock = functools.partial(float, at)
                app.lifecycle.decided(d)
                ttft = (prior.base_s + prior.per_token_s * uncached) * factor
                signals.clock = functools.partial(float, at + ttft)
                if respond and k == LESSONS - 1:
                    app.lifecycle.responded(d, 200, None)
                app.lifecycle.first_chunk(d)
                app.lifecycle.ended(d)
    finally:
        signals.clock = real


def scrape_all(app: Sidecar) -> None:
    """Every endpoint scraped once, through the scraper's own `take`, from a simulated engine's page whose
    load differs by endpoint (16 pages, so that values differ without parsing a new page text per engine)."""
    pages = [EngineMetrics("m", functools.partial(dict, {"vllm:num_requests_running": float(i % 8),
                                                         "vllm:num_requests_waiting": float(i % 3),
                                                         "vllm:kv_cache_usage_perc": 0.05 * i + 0.013}),
                           cache_config=(4096, 16)).render() for i in range(16)]
    for i, endpoint in enumerate(app.registry.snapshot()):
        app.scraper.take(endpoint, pages[i % len(pages)])


async def rendered(app: Sidecar, n: int, windows: tuple[Ticker, Holds, FullCollections],
                   between: Callable[[int], Awaitable[None]] | None = None) -> dict[str, Any]:
    """`/metrics` rendered n times in process, as its handler does (off the loop): figures() of the renders
    (the loop's lag and holds while they ran, not while `between(i)` ran before the i-th, untimed), the best
    wall time, the render thread's CPU, and the page's size."""
    page = app.metrics_page
    render_now, cpu, text = page.render_now, [], [b""]

    def counted(fleet: tuple[str, ...]) -> bytes:
        started = time.thread_time()
        try:
            text[0] = render_now(fleet)
            return text[0]
        finally:
            cpu.append(time.thread_time() - started)

    page.render_now = counted  # type: ignore[method-assign]  # the same call, its thread's CPU read around it
    ticker, holds, fulls = windows
    times: list[float] = []
    lags: list[float] = []
    held: list[float] = []
    collections: list[float] = []
    try:
        for i in range(n):
            if between is not None:
                await between(i)
                await asyncio.sleep(0.01)
            ticker.window()  # what ran before this render is not the render's
            holds.window()
            fulls.window()
            t = time.perf_counter()
            await page.render()
            times.append(time.perf_counter() - t)
            lags += ticker.window()
            held += holds.window()
            collections += fulls.window()
            await asyncio.sleep(0.01)
    finally:
        del page.render_now
    return {**figures(times, lags, held, collections), "min_ms": min(times) * 1e3,
            "cpu_mean_ms": statistics.fmean(cpu) * 1e3, "cpu_min_ms": min(cpu) * 1e3, "bytes": len(text[0]),
            "lines": text[0].count(b"\n")}


def traffic_between_pages(app: Sidecar, rng: random.Random) -> Callable[[int], Awaitable[None]]:
    """What changes in a busy fleet between two scrapes of /metrics, for `rendered`: every engine scraped
    again with another load, and requests come and go (the last round's 50 end, 50 new ones stay open), so
    only what really stays put (routing states, models, counters' creation times) can be reused."""
    held: list[Decision] = []

    async def between(i: int) -> None:
        for d in held:
            app.lifecycle.ended(d)
        held.clear()
        for k in range(50):
            held.append(await app.decider.decide(parse_body("completions", body(rng.randrange(PREFIXES),
                                                                                20_000 + 50 * i + k)), f"churn-{k}"))
        now = time.monotonic()
        for j, endpoint in enumerate(app.registry.snapshot()):
            running, waiting, kv = float((i + j) % 8), float((i + j) % 3), 0.05 * ((i + j) % 16) + 0.013
            app.loads.record(endpoint, EngineStats(running, waiting, kv, now))
            app.metrics.scraped(endpoint, running, waiting, kv)

    return between


async def measure_decisions(app: Sidecar, out: dict[str, Any], n: int, rng: random.Random,
                            windows: tuple[Ticker, Holds, FullCollections]) -> None:
    """n decisions in process (`Decider.decide`, counted, then ended): wall and CPU each."""
    if n == 0:
        return
    ticker, holds, fulls = windows
    times, cpu = [], []
    for i in range(n):
        parsed = parse_body("completions", body(rng.randrange(PREFIXES), 10_000 + i))
        t, c = time.perf_counter(), time.thread_time()
        d = await app.decider.decide(parsed, f"bench-{i}")
        cpu.append(time.thread_time() - c)
        times.append(time.perf_counter() - t)
        app.lifecycle.ended(d)
        await asyncio.sleep(0)
    out["decide"] = {**figures(times, ticker.window(), holds.window(), fulls.window()),
                     "cpu_mean_ms": statistics.fmean(cpu) * 1e3,
                     "cpu_p50_ms": statistics.median(cpu) * 1e3}


async def measure_size(n: int, reps: dict[str, int], policy: str = "loadaware", learned: bool = False,
                       full_scan: bool = False, all_queueing: bool = False, busy: bool = False,
                       ops: frozenset[str] | None = None) -> dict[str, Any]:
    flags = ["--endpoints", ",".join(fleet(n)), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0", "--admin-http-listen", "127.0.0.1:0",
             "--prefix-source", "approx", "--policy", policy, "--log-level", "warning"]
    if busy:  # the one scrape each engine gets stays fresh for the whole run
        flags += ["--scrape-stale-s", "3600"]

    def wanted(op: str) -> bool:
        return ops is None or op in ops
    app = Sidecar(from_args(flags, environ={}))
    app.scraper.run = idle  # type: ignore[method-assign]  # no engines: a scrape would only fail
    assert app.models is not None and app.models_poller is not None
    app.models_poller.run = idle  # type: ignore[method-assign]  # ... and so would a model list's fetch:
    for endpoint in app.registry.snapshot():  # every engine serves "m", as its /v1/models would say
        app.models.record(endpoint, ServedModels(frozenset({"m"})))
    thresholds = gc.get_threshold()
    settle_heap()  # as the CLI does once the sidecar is built
    await app.start()
    ticker = Ticker()
    holds = Holds()
    fulls = FullCollections()
    out: dict[str, Any] = {"endpoints": n}
    rng = random.Random(n)
    try:
        if learned or busy:
            teach_prices(app, rng, respond=busy)
        if busy:
            scrape_all(app)
        if full_scan:
            app.decider.selection.ranking = None  # every endpoint scored
        if all_queueing:  # fresh scrapes with a queue on every engine (the bench runs well within --scrape-stale-s)
            for endpoint in app.registry.snapshot():
                app.loads.record(endpoint, EngineStats(64, 2, None, time.monotonic()))
        # Warm the approximate index and leave requests open so loads differ.
        kept = []
        for i in range(OPEN_REQUESTS + 200):
            d = await app.decider.decide(parse_body("completions", body(i % PREFIXES, i)), f"warm-{i}")
            if i < OPEN_REQUESTS:
                kept.append(d)
            else:
                app.lifecycle.ended(d)
        ticker.start()
        holds.install()
        fulls.install()
        await asyncio.sleep(0.05)
        ticker.window()
        holds.window()
        fulls.window()
        await asyncio.sleep(1.0)
        out["idle"] = figures([1.0], ticker.window(), holds.window(), fulls.window())
        if wanted("busy_thread"):
            t = time.perf_counter()
            await asyncio.to_thread(spin, 1.0)
            out["busy_thread"] = figures([time.perf_counter() - t], ticker.window(), holds.window(), fulls.window())
        await measure_decisions(app, out, reps["decide"] if wanted("decide") else 0, rng, (ticker, holds, fulls))
        if wanted("metrics_render"):
            out["metrics_render"] = await rendered(app, reps["metrics"], (ticker, holds, fulls),
                                                   traffic_between_pages(app, rng) if busy else None)

        ext = f"127.0.0.1:{app.bound_port}"
        admin = f"127.0.0.1:{app.admin_port}"
        metrics_url = f"http://127.0.0.1:{app.metrics_http.port}/metrics"
        debug = f"http://127.0.0.1:{app.debug_http.port}"

        def grpc_decisions() -> list[float]:
            with grpc.insecure_channel(ext) as channel:
                stub = ext_grpc.ExternalProcessorStub(channel)
                route_once(stub, "warm", body(0, 0))
                return timed(lambda: route_once(stub, "bench", body(rng.randrange(PREFIXES), rng.randrange(10**6))),
                             reps["grpc_decide"])

        def explains() -> list[float]:
            with grpc.insecure_channel(admin) as channel:
                stub = pb_grpc.RouterStub(channel)
                request = pb.ExplainRequest(raw_body=body(3, 3).decode())
                stub.Explain(request, timeout=300)
                return timed(lambda: stub.Explain(request, timeout=300), reps["explain"])

        for op, client in (("grpc_decide", grpc_decisions), ("explain", explains),
                           ("metrics", lambda: timed(lambda: http_get(metrics_url), reps["metrics"])),
                           ("debug_state", lambda: timed(lambda: http_get(debug + "/debug/state"), reps["debug"])),
                           ("debug_decisions", lambda: timed(lambda: http_get(debug + "/debug/decisions"),
                                                             reps["debug"]))):
            if not wanted(op):
                continue
            ticker.window()
            holds.window()
            fulls.window()
            times = await asyncio.to_thread(client)
            out[op] = figures(times, ticker.window(), holds.window(), fulls.window())
        # The periodic full collection (--gc-full-interval-s), on the loop, after the traffic and the pages.
        collector = app.full_collections
        ticker.window()
        holds.window()
        fulls.window()
        times = []
        for _ in range(reps["full_gc"] if wanted("full_gc") else 0):
            t = time.perf_counter()
            collector.collect() if collector is not None else gc.collect()
            times.append(time.perf_counter() - t)
            await asyncio.sleep(0.01)
        if times:
            out["full_gc"] = figures(times, ticker.window(), holds.window(), fulls.window())
        for d in kept:
            app.lifecycle.ended(d)
    finally:
        holds.uninstall()
        fulls.uninstall()
        await ticker.stop()
        await app.stop()
        gc.unfreeze()  # the next size starts from the same heap rules
        gc.set_threshold(*thresholds)
    return out


def run(quick: bool = False, sizes: Sequence[int] = SIZES, policy: str = "loadaware", learned: bool = False,
        full_scan: bool = False, all_queueing: bool = False, busy: bool = False,
        ops: frozenset[str] | None = None) -> dict[str, Any]:
    reps = {"decide": 50, "grpc_decide": 30, "explain": 5, "metrics": 2, "debug": 2, "full_gc": 2} if quick else \
        {"decide": 300, "grpc_decide": 200, "explain": 20, "metrics": 5, "debug": 5, "full_gc": 5}
    import loadaware
    return {"tree": str(Path(loadaware.__file__).resolve().parents[1]), "reps": reps, "policy": policy,
            "learned": learned, "full_scan": full_scan, "all_queueing": all_queueing, "busy": busy,
            "sizes": [asyncio.run(measure_size(n, reps, policy, learned, full_scan, all_queueing, busy, ops))
                      for n in sizes]}


def run_baseline(ref: str, quick: bool, sizes: Sequence[int], extra: Sequence[str] = ()) -> dict[str, Any]:
    """The same measurement on commit `ref`: exported to a temporary folder, this file copied in, run there
    (`extra`: --busy and --ops, passed on)."""
    with tempfile.TemporaryDirectory(prefix="fleet-size-baseline-") as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        shutil.copy(Path(__file__), Path(tmp) / "bench" / "fleet_size.py")
        args = [sys.executable, "-m", "bench.fleet_size", "--json", "--sizes", ",".join(map(str, sizes)), *extra]
        env = {**os.environ, "PYTHONPATH": tmp}
        done = subprocess.run(args + (["--quick"] if quick else []), cwd=tmp, env=env, capture_output=True,
                              text=True)
        if done.returncode:
            raise RuntimeError(f"the baseline run failed:\n{done.stderr[-4000:]}")
        result: dict[str, Any] = json.loads(done.stdout)
        result["ref"] = ref
        return result


def table(result: dict[str, Any], baseline: dict[str, Any] | None = None) -> str:
    title = ("### Fleet size: per call wall time (mean, max; in-process decisions also CPU), the event loop's lag "
             "while it runs (max, p99) and the longest the sidecar's code held the loop (CPU, max, p99)\n")
    rows = [title, f"Tree: {result['tree']}; policy {result.get('policy', 'loadaware')}"
            + ("; every engine queues" if result.get("all_queueing") else "")
            + ("; a busy fleet's state on every endpoint" if result.get("busy") else "")
            + (f"; before = {baseline['ref']}" if baseline else ""), "",
            "| endpoints | call | " + ("before: p50 / mean / max ms | before: lag max / p99 | before: held max / p99 "
                                     "| before: full GCs (max ms) | " if baseline else "")
            + "p50 / mean / max ms | lag max / p99 ms | held max / p99 ms | full GCs (max ms) |",
            "|---|---|" + ("---|---|---|---|" if baseline else "") + "---|---|---|---|"]
    before = {s["endpoints"]: s for s in baseline["sizes"]} if baseline else {}

    def cells(f: dict[str, float]) -> str:
        cpu = f" (CPU {f['cpu_mean_ms']:.3f})" if "cpu_mean_ms" in f else ""
        return (f"{f['p50_ms']:.3f} / {f['mean_ms']:.3f}{cpu} / {f['max_ms']:.3f} | "
                f"{f['lag_max_ms']:.1f} / {f['lag_p99_ms']:.1f} | "
                f"{f.get('hold_max_ms', 0.0):.1f} / {f.get('hold_p99_ms', 0.0):.2f} | "
                f"{f.get('full_gc_n', 0)} ({f.get('full_gc_max_ms', 0.0):.0f}) |")

    for size in result["sizes"]:
        for op in (op for op in OPS if op in size):
            line = f"| {size['endpoints']:,} | {op} | "
            if baseline:
                b = before.get(size["endpoints"], {}).get(op)
                line += cells(b) + " " if b else "- | - | - | - | "
            rows.append(line + cells(size[op]))
    for size in result["sizes"]:
        for label, record in (("before", before.get(size["endpoints"])), ("after" if baseline else "", size)):
            r = (record or {}).get("metrics_render")
            if r:
                rows.append(f"\n/metrics rendered in process at {size['endpoints']:,} endpoints"
                            f"{' ' + label if label else ''}: best {r['min_ms']:.1f} ms wall, {r['cpu_min_ms']:.1f} ms "
                            f"CPU (p50 {r['p50_ms']:.1f} ms); {r['bytes'] / 2**20:.1f} MiB, {r['lines']:,} lines")
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet_size", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions: a smoke run, not a measurement")
    p.add_argument("--json", action="store_true", help="print the JSON record instead of the table")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma list of fleet sizes")
    p.add_argument("--baseline", default=None, help="a git ref to measure too, side by side ('before')")
    p.add_argument("--policy", default="loadaware", help="the policy deciding (default loadaware: pruned)")
    p.add_argument("--full-scan", action="store_true", help="score every endpoint (the pruning off)")
    p.add_argument("--all-queueing", action="store_true", help="every engine's scrape shows an admission queue")
    p.add_argument("--learned", action="store_true",
                   help=f"every endpoint learns its prices first (within +-{LEARNED_SPREAD:.0%} of the prior's)")
    p.add_argument("--busy", action="store_true", help="--learned, and every endpoint scraped and answered once: "
                   "every per-endpoint /metrics series present")
    p.add_argument("--ops", default=None, help=f"comma list of the calls to measure (of {', '.join(OPS[1:])})")
    args = p.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(",") if s.strip())
    ops = frozenset(o.strip() for o in args.ops.split(",") if o.strip()) if args.ops else None
    if ops is not None and not ops <= set(OPS):
        p.error(f"--ops: unknown {sorted(ops - set(OPS))}")
    extra = (["--busy"] if args.busy else []) + (["--ops", args.ops] if args.ops else [])
    baseline = run_baseline(args.baseline, args.quick, sizes, extra) if args.baseline else None
    result = run(args.quick, sizes, args.policy, args.learned, args.full_scan, args.all_queueing, args.busy, ops)
    if args.json:
        print(json.dumps({**result, "baseline": baseline} if baseline else result, indent=2))
    else:
        print(table(result, baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
