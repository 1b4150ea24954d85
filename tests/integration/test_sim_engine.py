"""Simulated engines over HTTP: OpenAI shapes, streaming, test hooks, slot accounting, metrics, the CLI."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from sim.fleet import DEFAULT_TOKENIZER, Fleet, start_fleet
from sim.service_model import PrefillLane, ServiceModel
from sim.tokenization import SimTokenizer
from tests.conftest import wait_until_async

REPO = Path(__file__).resolve().parents[2]
PROMPT = " ".join(["the cache engine token model prefix router load"] * 200)  # ~1,600 tokens


@pytest.fixture(autouse=True)
def no_handler_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """An exception escaping a handler (aiohttp logs it) is a bug even when the client saw nothing."""
    yield
    errors = [r for r in caplog.records if r.levelno >= 40 and r.name.startswith(("aiohttp", "sim"))]
    assert not errors, [r.getMessage() for r in errors]


@pytest.fixture(scope="module")
def tok() -> SimTokenizer:
    return SimTokenizer(DEFAULT_TOKENIZER)


@pytest.fixture
async def fleet(tok: SimTokenizer) -> AsyncIterator[Fleet]:
    f = await start_fleet(2, base_ip="127.0.0.32", port=0, tokenizer=tok,
                          service=ServiceModel(max_num_seqs=2, decode_base_ms=5, decode_per_seq_ms=0))
    yield f
    await f.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def state(http: aiohttp.ClientSession, url: str) -> dict:
    async with http.get(url + "/sim/state") as r:
        return await r.json()


async def wait_state(http: aiohttp.ClientSession, url: str, condition: Callable[[dict], bool], what: str) -> dict:
    """The engine's /sim/state once `condition` holds on it (slots change asynchronously to the client)."""
    async def matching_state() -> dict | None:
        st = await state(http, url)
        return st if condition(st) else None

    return await wait_until_async(matching_state, message=f"{url}: {what}")


async def wait_idle(http: aiohttp.ClientSession, url: str) -> dict:
    return await wait_state(http, url, lambda st: (st["running"], st["waiting"]) == (0, 0),
                            "nothing running or waiting")


@dataclass(frozen=True)
class Booking:
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


class RecordingPrefillLane(PrefillLane):
    """The engine's prefill lane, remembering every prefill it booked: the engine's own schedule, which
    tests can assert exactly, unlike wall-clock durations on a machine shared with other processes."""

    def __init__(self) -> None:
        super().__init__()
        self.bookings: list[Booking] = []

    def reserve(self, now: float, duration: float) -> float:
        start = max(now, self.free_at)
        end = super().reserve(now, duration)
        self.bookings.append(Booking(start, end))
        return end


def record_prefills(fleet: Fleet, engine: int = 0) -> RecordingPrefillLane:
    lane = RecordingPrefillLane()
    fleet.engines[engine].core._prefill_lane = lane  # the lane is internal: swapped in before any request
    return lane


def sse_events(raw: bytes) -> list[str]:
    return [line[len("data: "):] for line in raw.decode().split("\n\n") if line.startswith("data: ")]


async def test_engines_listen_on_consecutive_ips(fleet: Fleet) -> None:
    assert [e["ip"] for e in fleet.describe()] == ["127.0.0.32", "127.0.0.33"]
    assert [e["name"] for e in fleet.describe()] == ["engine-0", "engine-1"]


async def test_streaming_and_non_streaming_agree(fleet: Fleet, http: aiohttp.ClientSession, tok: SimTokenizer) -> None:
    url = fleet.engines[0].url
    async with http.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 5}) as r:
        assert r.status == 200 and r.headers["x-served-by"] == "engine-0"
        full = await r.json()
    assert full["object"] == "text_completion"
    assert full["usage"] == {"prompt_tokens": len(tok.encode_prompt(PROMPT)), "completion_tokens": 5,
                             "total_tokens": len(tok.encode_prompt(PROMPT)) + 5}
    async with http.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "stream": True,
                                                        "stream_options": {"include_usage": True}}) as r:
        assert r.status == 200 and r.headers["x-served-by"] == "engine-0"
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(await r.read())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == full["choices"][0]["text"]
    assert chunks[4]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 5


async def test_chat_streams_deltas(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.engines[1].url
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}], "max_tokens": 3}
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        assert r.headers["x-served-by"] == "engine-1"
        full = await r.json()
    assert full["object"] == "chat.completion" and full["choices"][0]["message"]["role"] == "assistant"
    async with http.post(url + "/v1/chat/completions", json={**body, "stream": True}) as r:
        events = sse_events(await r.read())
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert streamed == full["choices"][0]["message"]["content"]


async def test_injected_failure(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.engines[0].url
    async with http.post(url + "/v1/completions", json={"prompt": "x"}, headers={"x-sim-fail": "503"}) as r:
        assert r.status == 503 and r.headers["x-served-by"] == "engine-0"
        body = await r.json()
    assert body["error"]["code"] == 503 and "message" in body["error"]
    assert (await state(http, url))["failed"] == 1


async def test_bad_requests_get_json_errors(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.engines[0].url
    async with http.post(url + "/v1/completions", data=b"not json") as r:
        assert r.status == 400 and "error" in await r.json()
    async with http.post(url + "/v1/completions", json={"max_tokens": 3}) as r:
        assert r.status == 400
    async with http.post(url + "/v1/completions", json={"prompt": "x", "model": "other"}) as r:
        assert r.status == 404
    async with http.get(url + "/nope") as r:
        assert r.status == 404 and r.headers["x-served-by"] == "engine-0"


async def test_abort_after_drops_connection_and_frees_slot(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.engines[0].url
    got: list[bytes] = []
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 50, "stream": True},
                             headers={"x-sim-abort-after": "3"}) as r:
            assert r.status == 200
            async for line in r.content:
                if line.startswith(b"data: "):
                    got.append(line)
    assert len(got) == 3
    st = await wait_idle(http, url)
    assert (st["running"], st["waiting"], st["aborted"], st["served"]) == (0, 0, 1, 0)


async def test_client_disconnect_frees_running_and_waiting_slots(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.engines[1].url  # max_num_seqs=2: 2 run, 1 waits

    # 5,000 tokens of >= 5 ms each: no request can finish on its own while the test looks, however slow
    # the machine; they end only when the test hangs up.
    async def stream_one_then_hang_up() -> None:
        async with http.post(url + "/v1/completions", json={"prompt": "the cache", "max_tokens": 5000,
                                                            "stream": True}) as r:
            await r.content.readline()
            await asyncio.Event().wait()  # keep the connection open until cancelled

    tasks = [asyncio.create_task(stream_one_then_hang_up()) for _ in range(2)]
    waiter = asyncio.create_task(http.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 5000}))
    st = await wait_state(http, url, lambda st: st["running"] + st["waiting"] == 3, "all three requests in")
    assert (st["running"], st["waiting"]) == (2, 1)
    for t in (*tasks, waiter):
        t.cancel()
    await asyncio.gather(*tasks, waiter, return_exceptions=True)
    st = await wait_idle(http, url)
    assert (st["running"], st["waiting"]) == (0, 0) and st["aborted"] == 2 and st["served"] == 0


async def test_queueing_shows_in_metrics(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    engine = fleet.engines[0]
    url = engine.url
    scheduler = engine.core.scheduler  # the engine runs in this process and event loop
    # The test holds both slots (max_num_seqs=2) so that all five requests are queued when it looks, however
    # slowly they arrive; handing the slots over then admits the first two exactly as finishing requests do.
    for _ in range(scheduler.max_num_seqs):
        await scheduler.acquire()
    reqs = [asyncio.create_task(http.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 20}))
            for _ in range(5)]
    await wait_until_async(lambda: scheduler.waiting == 5, message="five requests queued behind the held slots")
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    assert 'vllm:num_requests_running{engine="0",model_name="tiny-model"} 2.0' in text
    assert 'vllm:num_requests_waiting{engine="0",model_name="tiny-model"} 5.0' in text
    for _ in range(scheduler.max_num_seqs):
        scheduler.release()
    # Read in the same tick as the hand-over (no await in between), so no request has finished yet: the
    # text the /metrics handler renders.
    text = engine.core.metrics.render()
    assert 'vllm:num_requests_running{engine="0",model_name="tiny-model"} 2.0' in text
    assert 'vllm:num_requests_waiting{engine="0",model_name="tiny-model"} 3.0' in text
    for resp in await asyncio.gather(*reqs):
        assert resp.status == 200
        resp.release()
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    assert 'vllm:request_success_total{engine="0",model_name="tiny-model",finished_reason="length"} 5.0' in text
    assert 'vllm:generation_tokens_total{engine="0",model_name="tiny-model"} 100.0' in text
    assert 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny-model"} 5.0' in text


async def test_prefix_cache_hit_is_faster_and_counted(tok: SimTokenizer, http: aiohttp.ClientSession) -> None:
    # A slow prefill makes the hit obvious: 1,600 cold tokens = 160 ms, a hit recomputes ~1 block.
    service = ServiceModel(prefill_tokens_per_s=10_000, prefill_overhead_ms=1)
    f = await start_fleet(1, base_ip="127.0.0.36", port=0, tokenizer=tok, service=service)
    try:
        url = f.engines[0].url
        lane = record_prefills(f)
        n = len(tok.encode_prompt(PROMPT))
        reused = min((n // 16) * 16, n - 1)  # every full block, but the last token is always recomputed
        times = []
        for _ in range(2):
            t0 = time.monotonic()
            async with http.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}) as r:
                assert r.status == 200
            times.append(time.monotonic() - t0)
        # The engine's own schedule, exact whatever the machine's load: the hit computes only the uncached
        # tail, and the cold request's wall time includes its whole prefill (a lower bound always holds).
        cold, hit = lane.bookings
        assert cold.seconds == pytest.approx(service.prefill_seconds(n))
        assert hit.seconds == pytest.approx(service.prefill_seconds(n - reused))
        assert hit.seconds < cold.seconds / 10
        assert times[0] >= cold.seconds, times
        st = await state(http, url)
        assert st["prefix_cache_hits_total"] == reused
        assert st["cached_blocks"] == n // 16
        async with http.get(url + "/metrics") as r:
            text = await r.text()
        assert f'vllm:prefix_cache_queries_total{{engine="0",model_name="tiny-model"}} {float(2 * n)}' in text
        # Both requests ended: their blocks stay cached but no request holds them, so (as in vLLM) no usage.
        usage = float(text.split('vllm:kv_cache_usage_perc{engine="0",model_name="tiny-model"} ')[1].split()[0])
        assert usage == 0.0
        async with http.post(url + "/sim/reset_cache") as r:
            assert (await r.json())["cleared_blocks"] == n // 16
        assert (await state(http, url))["cached_blocks"] == 0
    finally:
        await f.stop()


async def test_phantom_load_shows_in_gauges(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    url = fleet.engines[1].url
    async with http.post(url + "/sim/phantom_load", json={"running": 7, "waiting": 4}) as r:
        assert r.status == 200
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    assert 'vllm:num_requests_running{engine="0",model_name="tiny-model"} 7.0' in text
    assert 'vllm:num_requests_waiting{engine="0",model_name="tiny-model"} 4.0' in text
    st = await state(http, url)
    assert st["phantom"] == {"running": 7, "waiting": 4} and st["running"] == 0


async def test_tokenize_models_health(fleet: Fleet, http: aiohttp.ClientSession, tok: SimTokenizer) -> None:
    url = fleet.engines[0].url
    messages = [{"role": "user", "content": "hello there"}]
    async with http.post(url + "/tokenize", json={"messages": messages}) as r:
        body = await r.json()
    assert body["tokens"] == tok.encode_chat(messages) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 32768
    async with http.post(url + "/tokenize", json={"prompt": "the cache"}) as r:
        assert (await r.json())["tokens"] == tok.encode_prompt("the cache")
    async with http.get(url + "/v1/models") as r:
        assert [m["id"] for m in (await r.json())["data"]] == ["tiny-model"]
    async with http.get(url + "/health") as r:
        assert r.status == 200 and r.headers["x-served-by"] == "engine-0"


async def test_token_id_prompt_is_used_as_is(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    async with http.post(fleet.engines[0].url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 1}) as r:
        assert (await r.json())["usage"]["prompt_tokens"] == 3


def test_cli_prints_ready_and_exits_cleanly_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.fleet", "--engines", "2", "--base-ip", "127.0.0.38", "--port", "0",
         "--tokenizer", str(DEFAULT_TOKENIZER), "--names", "alpha,beta", "--max-num-seqs", "4"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("READY "), (line, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
        engines = json.loads(line[len("READY "):])
        assert [(e["name"], e["ip"]) for e in engines] == [("alpha", "127.0.0.38"), ("beta", "127.0.0.39")]
        assert all(e["url"] == f"http://{e['ip']}:{e['port']}" for e in engines)
        import urllib.request
        with urllib.request.urlopen(engines[1]["url"] + "/sim/state", timeout=5) as r:
            assert r.headers["x-served-by"] == "beta"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_concurrent_cold_prefills_share_the_engine(tok: SimTokenizer, http: aiohttp.ClientSession) -> None:
    service = ServiceModel(prefill_tokens_per_s=20_000, prefill_overhead_ms=0)
    f = await start_fleet(1, base_ip="127.0.0.37", port=0, tokenizer=tok, service=service)
    try:
        url = f.engines[0].url
        lane = record_prefills(f)
        started = time.monotonic()

        async def ttft(i: int) -> float:
            async with http.post(url + "/v1/completions", json={"prompt": f"{i} " + PROMPT, "max_tokens": 1}) as r:
                assert r.status == 200
            return time.monotonic() - started

        times = sorted(await asyncio.gather(ttft(1), ttft(2)))  # ~80 ms of prefill each
        # Orderings that hold whatever the scheduling: the second prefill starts only when the first has
        # ended (one GPU, FIFO), each takes its own full prefill time (not stretched by sharing), and so the
        # later request waited for both prefills.
        first, second = lane.bookings
        assert second.start >= first.end, lane.bookings
        cold = [service.prefill_seconds(len(tok.encode_prompt(f"{i} " + PROMPT))) for i in (1, 2)]
        assert sorted([first.seconds, second.seconds]) == pytest.approx(sorted(cold))
        assert times[0] >= min(cold) and times[1] >= sum(cold), times
    finally:
        await f.stop()
