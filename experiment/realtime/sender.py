"""The open-loop client of one (arm, seed) run, in its own process (never inside the servers' processes).

    python -m experiment.realtime.sender SPEC.json OUT.json

It builds the seed's workload itself (deterministic: `experiment.workload.build`), then
1. warm-up: each pass over every prefix is sent open-loop at its own pace through the router under test, and
   drained before the next (so a prefix's second visit sees its first visit's cache entry);
2. settles, scrapes every engine once (the window opens), and sends the measured requests open-loop at
   their scheduled times while scraping every engine's /metrics on an interval; once the last response has
   ended it scrapes once more (the window closes).

Open loop: a request is launched at its scheduled time whatever earlier ones are doing; its send time is the
scheduled time, so a late launch shows up as latency, not as a hidden gap (no coordinated omission). Per
request it records the send time, the first streamed token, every later token's gap, the end, the status
and the serving engine (`x-served-by`, set by the engines and passed through by Envoy and both peers).
Times are seconds on this process's perf_counter clock; samples use the same clock, so the window is exact.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import aiohttp

from experiment.agentic import AgenticSpec
from experiment.realtime.agentic_sender import AgenticClient
from experiment.realtime.scrape import to_sample
from experiment.records import EngineSample, RequestRecord
from experiment.workload import Request, WorkloadSpec, build

SERVED_BY = "x-served-by"
# uvloop's loop.time() ticks in whole milliseconds (libuv's uv_now): fine for scheduling sends, too coarse
# for token gaps of a few ms. Every recorded time comes from this clock instead.
clock = time.perf_counter


@dataclass
class SenderSpec:
    url: str  # Envoy's listener or the peer router
    seed: int
    workload: dict[str, Any]  # WorkloadSpec fields (JSON-able)
    engines: dict[str, str]  # engine name -> base URL, scraped directly (not through the router)
    scrape_interval_s: float = 0.5
    settle_s: float = 1.0  # idle gap between the drained warm-up and the window's opening scrape
    request_timeout_s: float = 300.0  # per request, total: a saturated arm's queue can grow long
    drain_timeout_s: float = 300.0  # after the last scheduled send, what is still open then is an error
    warmup: bool = True
    tokenizer_dir: str | None = None
    agentic: dict[str, Any] | None = None  # experiment.agentic.AgenticSpec fields: closed-loop agent sessions

    def workload_spec(self) -> WorkloadSpec:
        return WorkloadSpec(**self.workload)

    @classmethod
    def from_json(cls, text: str) -> SenderSpec:
        data = json.loads(text)
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass
class SenderResult:
    requests: list[RequestRecord]
    samples: list[EngineSample]
    window: tuple[float, float]
    warmup_sent: int = 0
    warmup_errors: int = 0
    warmup_wall_s: float = 0.0
    measure_wall_s: float = 0.0
    launch_lag_p99_ms: float = 0.0  # how late this process launched measured requests (starvation gauge)
    launch_lag_max_ms: float = 0.0
    scrape_errors: int = 0
    cpu_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # what a workload adds (agentic: follow-ups' statuses)

    def to_json(self) -> str:
        d = asdict(self)
        return json.dumps(d, separators=(",", ":"))


def record_from_dict(d: dict[str, Any]) -> RequestRecord:
    return RequestRecord(**{f.name: d[f.name] for f in fields(RequestRecord) if f.name in d})


def sample_from_dict(d: dict[str, Any]) -> EngineSample:
    return EngineSample(**d)


def result_from_json(text: str) -> SenderResult:
    d = json.loads(text)
    d["requests"] = [record_from_dict(r) for r in d["requests"]]
    d["samples"] = [sample_from_dict(s) for s in d["samples"]]
    d["window"] = tuple(d["window"])
    return SenderResult(**d)


class Client:
    """One keep-alive session for the whole run: connection setup stays out of the measured latencies."""

    def __init__(self, spec: SenderSpec, session: aiohttp.ClientSession) -> None:
        self.spec = spec
        self.session = session
        self.launch_lags: list[float] = []

    async def one(self, req: Request, body: bytes, rec: RequestRecord) -> None:
        """Send one streamed request; fills `rec`. Never raises (a failure is a record with an error)."""
        self.launch_lags.append(clock() - rec.send_t)
        try:
            async with self.session.post(self.spec.url + req.path, data=body,
                                         headers={"content-type": "application/json"}) as resp:
                rec.engine = resp.headers.get(SERVED_BY)
                if resp.status != 200:
                    await resp.read()
                    rec.error = f"http_{resp.status}"
                    rec.end_t = clock()
                    return
                last = 0.0
                done = False
                n = 0
                # One SSE event per token from the engines; `data: [DONE]` ends a complete stream.
                async for line in resp.content:
                    if not line.startswith(b"data: "):
                        continue
                    if line.startswith(b"data: [DONE]"):
                        done = True
                        break
                    now = clock()
                    if n == 0:
                        rec.first_token_t = now
                    else:
                        rec.itl.append(now - last)
                    last = now
                    n += 1
                rec.end_t = clock()
                rec.output_tokens = n
                if not done:
                    rec.error = "truncated"
                elif n < req.max_tokens:
                    rec.error = "short"
                else:
                    rec.ok = True
        except TimeoutError:
            rec.error, rec.end_t = "timeout", clock()
        except aiohttp.ClientError as e:
            rec.error, rec.end_t = f"client_{type(e).__name__}", clock()

    async def send_open_loop(self, reqs: Sequence[Request], t0: float, deadline_after_s: float
                             ) -> list[RequestRecord]:
        """Launch every request at t0 + send_at; wait for all (bounded); unfinished ones time out."""
        bodies = [json.dumps(r.body(), separators=(",", ":")).encode() for r in reqs]
        records = [RequestRecord(r.index, t0 + r.send_at, prompt_tokens=r.prompt_tokens, prefix=r.prefix)
                   for r in reqs]
        tasks: list[asyncio.Task[None]] = []
        for req, body, rec in zip(reqs, bodies, records):
            delay = rec.send_t - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self.one(req, body, rec)))
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=deadline_after_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for rec in records:
                if rec.end_t is None and not rec.ok:
                    rec.error = rec.error or "drain_timeout"
                    rec.end_t = clock()
        return records


class Scraper:
    """Scrapes every engine's /metrics every `interval` while running, plus on demand.

    Pages are kept as text and parsed after the run (`samples()`): parsing one costs ~1 ms of CPU, which
    would otherwise land on the event loop that times every streamed token."""

    def __init__(self, session: aiohttp.ClientSession, engines: dict[str, str], interval: float) -> None:
        self.session = session
        self.engines = engines
        self.interval = interval
        self.times: list[float] = []
        self._pages: list[tuple[float, str, str]] = []  # (time, engine, /metrics text)
        self.errors = 0
        self._task: asyncio.Task[None] | None = None

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self._one(name, url) for name, url in self.engines.items()))

    async def _one(self, name: str, url: str) -> None:
        try:
            async with self.session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
                text = await resp.text()
            t = clock()
            self.times.append(t)
            self._pages.append((t, name, text))
        except (TimeoutError, aiohttp.ClientError):
            self.errors += 1

    async def _run(self) -> None:
        nxt = clock() + self.interval
        while True:
            await asyncio.sleep(max(0.0, nxt - clock()))
            nxt += self.interval
            await self.scrape_all()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def samples(self) -> list[EngineSample]:
        return [to_sample(t, name, text) for t, name, text in self._pages]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


async def run_agentic(spec: SenderSpec) -> SenderResult:
    """The agentic workload (experiment.realtime.agentic_sender): no warm-up (agent sessions start cold and build
    their own context), the engines scraped through the run."""
    cpu0 = time.process_time()
    assert spec.agentic is not None
    given: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.agentic.items()}
    agentic = AgenticSpec(**given)
    timeout = aiohttp.ClientTimeout(total=spec.request_timeout_s, sock_connect=5.0)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=None)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        client = AgenticClient(spec.url, session, agentic, spec.seed)
        gc.collect()
        gc.freeze()
        scraper = Scraper(session, spec.engines, spec.scrape_interval_s)
        await scraper.scrape_all()
        t_open = min(scraper.times, default=clock())
        scraper.start()
        t0 = clock()
        await client.run(2 * spec.drain_timeout_s)
        await scraper.stop()
        await scraper.scrape_all()
        t_close = max(scraper.times, default=clock())
    errors: dict[str, int] = {}
    for r in client.records:
        if not r.ok:
            errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
    return SenderResult(requests=client.records, samples=scraper.samples(), window=(t_open, t_close),
                        measure_wall_s=clock() - t0, scrape_errors=scraper.errors,
                        cpu_s=time.process_time() - cpu0, errors=errors, extra=client.extra())


async def run(spec: SenderSpec) -> SenderResult:
    if spec.agentic is not None:
        return await run_agentic(spec)
    cpu0 = time.process_time()
    wl_spec = spec.workload_spec()
    workload = build(wl_spec, spec.seed, *([spec.tokenizer_dir] if spec.tokenizer_dir else []))
    gc.collect()
    gc.freeze()  # the workload's objects live all run: keep the collector from walking them mid-measure
    timeout = aiohttp.ClientTimeout(total=spec.request_timeout_s, sock_connect=5.0)
    # No connection cap: an open-loop client must not queue requests behind its own pool.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=None)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        client = Client(spec, session)
        warm_records: list[RequestRecord] = []
        w0 = clock()
        if spec.warmup:
            for wave in sorted({r.wave for r in workload.warmup}):
                reqs = [r for r in workload.warmup if r.wave == wave]
                t0 = clock() + 0.05
                warm_records += await client.send_open_loop(reqs, t0, spec.drain_timeout_s + reqs[-1].send_at)
        warm_wall = clock() - w0
        await asyncio.sleep(spec.settle_s)
        scraper = Scraper(session, spec.engines, spec.scrape_interval_s)
        await scraper.scrape_all()  # opening scrape: the window starts here, before the first send
        t_open = min(scraper.times, default=clock())
        client.launch_lags.clear()
        scraper.start()
        t0 = clock() + 0.05
        reqs = list(workload.requests)
        records = await client.send_open_loop(reqs, t0, spec.drain_timeout_s + (reqs[-1].send_at if reqs else 0))
        await scraper.stop()
        await scraper.scrape_all()  # closing scrape: after the last response ended
        t_close = max(scraper.times, default=clock())
        measure_wall = clock() - t0
        lags_ms = [1000 * x for x in client.launch_lags]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
    return SenderResult(
        requests=records, samples=scraper.samples(), window=(t_open, t_close),
        warmup_sent=len(warm_records), warmup_errors=sum(1 for r in warm_records if not r.ok),
        warmup_wall_s=warm_wall, measure_wall_s=measure_wall,
        launch_lag_p99_ms=_pct(lags_ms, 99), launch_lag_max_ms=max(lags_ms, default=0.0),
        scrape_errors=scraper.errors, cpu_s=time.process_time() - cpu0, errors=errors)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m experiment.realtime.sender SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = SenderSpec.from_json(Path(args[0]).read_text())
    try:
        import uvloop

        result = uvloop.run(run(spec))
    except ImportError:  # pragma: no cover - uvloop is a dependency, but keep the client usable without
        result = asyncio.run(run(spec))
    out = Path(args[1])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(result.to_json())
    tmp.replace(out)  # the driver reads OUT only once it is complete
    return 0


if __name__ == "__main__":
    sys.exit(main())
