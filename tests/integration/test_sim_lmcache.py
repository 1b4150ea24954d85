"""Simulated engines against a real LMCache controller (from .lmcache-venv): the controller must credit
exactly what a real LMCache worker would have admitted, and forget it on reset and on deregistration."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

import aiohttp
import pytest

from sim.fleet import DEFAULT_TOKENIZER, Fleet, start_fleet
from sim.lmcache_chunks import chunk_keys
from sim.service_model import ServiceModel
from sim.tokenization import SimTokenizer
from testkit.lmcache import LMCacheControllerProc as ControllerProcess
from testkit.lmcache import start_controller
from testkit.require import requires_lmcache
from tests.conftest import wait_until, wait_until_async

pytestmark = requires_lmcache()

T = TypeVar("T")

WORDS = [
    "the", "cache", "engine", "token", "model", "prefix", "router", "load", "balance", "query", "answer",
    "document", "context",
]


def make_prompt(seed: int, n_words: int = 1600) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


@pytest.fixture(scope="module")
def controller() -> Iterator[ControllerProcess]:
    ctl = start_controller()
    yield ctl
    ctl.stop()


@pytest.fixture(scope="module")
def tok() -> SimTokenizer:
    return SimTokenizer(DEFAULT_TOKENIZER)


async def eventually(check: Callable[[], T], what: str) -> T:
    """Admits, evictions and deregistrations travel over PUSH/PULL asynchronously: poll until the controller
    agrees (its client is blocking, so each check runs off the event loop)."""
    return await wait_until_async(lambda: asyncio.to_thread(check), message=what)


@pytest.fixture
async def fleet(controller: ControllerProcess, tok: SimTokenizer,
                request: pytest.FixtureRequest) -> AsyncIterator[Fleet]:
    names = [f"{request.node.name[:20]}-a", f"{request.node.name[:20]}-b"]
    f = await start_fleet(2, base_ip="127.0.0.42", port=0, tokenizer=tok, lmcache=controller.address,
                          service=ServiceModel(), names=names)
    yield f
    await f.stop()


async def test_lookup_credits_the_engine_that_served_the_prompt(controller: ControllerProcess, fleet: Fleet,
                                                                tok: SimTokenizer) -> None:
    a, b = fleet.engines
    assert a.reporter is not None and a.reporter.registered and b.reporter is not None and b.reporter.registered
    prompt = make_prompt(1)
    async with aiohttp.ClientSession() as s:
        async with s.post(a.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}) as r:
            assert r.status == 200 and r.headers["x-served-by"] == a.name
            n = (await r.json())["usage"]["prompt_tokens"]
    tokens = tok.encode_prompt(prompt)
    assert n == len(tokens) and 1500 <= n <= 2000 and n % 256 != 0
    expected = (n // 256) * 256

    def credited() -> dict | None:
        layout = controller.lookup(tokens)
        return layout if layout.get(a.name) == ["LocalCPUBackend", expected] else None

    layout = await eventually(credited, f"the controller to credit {a.name} with {expected} tokens")
    assert layout == {a.name: ["LocalCPUBackend", expected]}, controller.lookup(tokens)
    # Our key computation is the controller's: every chunk key we admitted is what it hashed.
    assert len(chunk_keys(tokens)) == n // 256 == len(a.core.lmcache)

    # An unrelated prompt is held by nobody.
    assert controller.lookup(tok.encode_prompt(make_prompt(2))) == {}
    # A prompt that shares the first 3 chunks then diverges is credited with exactly those 3 chunks.
    diverged = tokens[:768] + [5] * 300
    assert controller.lookup(diverged) == {a.name: ["LocalCPUBackend", 768]}

    # Reset evicts every chunk from the controller too.
    async with aiohttp.ClientSession() as s:
        async with s.post(a.url + "/sim/reset_cache") as r:
            assert (await r.json())["evicted_chunks"] == n // 256
    await eventually(lambda: controller.lookup(tokens) == {}, "the reset's evictions to reach the controller")


async def test_chat_prompt_is_keyed_on_its_template_tokens(controller: ControllerProcess, fleet: Fleet,
                                                           tok: SimTokenizer) -> None:
    _, b = fleet.engines
    messages = [{"role": "system", "content": make_prompt(3, 700)}, {"role": "user", "content": "hi"}]
    async with aiohttp.ClientSession() as s:
        async with s.post(b.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 1}) as r:
            assert r.status == 200
    tokens = tok.encode_chat(messages)
    expected = (len(tokens) // 256) * 256
    assert expected >= 512
    layout = await eventually(lambda: controller.lookup(tokens), "the controller to credit the chat prompt")
    assert layout == {b.name: ["LocalCPUBackend", expected]}


async def test_stop_deregisters_and_forgets_chunks(controller: ControllerProcess, tok: SimTokenizer) -> None:
    f = await start_fleet(1, base_ip="127.0.0.45", port=0, tokenizer=tok, lmcache=controller.address,
                          names=["dereg-engine"])
    e = f.engines[0]
    info = await asyncio.to_thread(controller.post, "/query_worker_info", {"instance_id": "dereg-engine"})
    assert [w["ip"] for w in info["worker_infos"]] == ["127.0.0.45"]
    prompt = make_prompt(4, 600)
    async with aiohttp.ClientSession() as s:
        async with s.post(e.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as r:
            assert r.status == 200
    tokens = tok.encode_prompt(prompt)
    await eventually(lambda: controller.lookup(tokens), "the controller to credit the prompt")
    await f.stop()

    await eventually(lambda: controller.lookup(tokens) == {}, "the stopped engine's chunks forgotten")
    await eventually(lambda: not controller.post("/query_worker_info", {"instance_id": "dereg-engine"})["worker_infos"],
                     "the stopped engine deregistered")


async def test_engine_serves_without_a_controller(tok: SimTokenizer) -> None:
    from sim.lmcache_reporter import ControllerAddress
    from testkit.ports import free_ports

    pull, reply = free_ports(2)
    f = await start_fleet(1, base_ip="127.0.0.46", port=0, tokenizer=tok,
                          lmcache=ControllerAddress("127.0.0.1", pull, reply))
    try:
        e = f.engines[0]
        assert e.reporter is not None and not e.reporter.registered
        async with aiohttp.ClientSession() as s:
            async with s.post(e.url + "/v1/completions", json={"prompt": make_prompt(5, 600), "max_tokens": 2}) as r:
                assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 2
    finally:
        await f.stop()


def test_cli_fleet_registers_and_deregisters(controller: ControllerProcess) -> None:
    import json
    import signal
    import subprocess
    import sys
    from pathlib import Path

    names = ["cli-engine-x", "cli-engine-y"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.fleet", "--engines", "2", "--base-ip", "127.0.0.48", "--port", "0",
         "--names", ",".join(names), "--lmcache-host", controller.host,
         "--lmcache-pull-port", str(controller.pull_port), "--lmcache-reply-port", str(controller.reply_port)],
        cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("READY ")
        engines = json.loads(line[len("READY "):])
        assert [e["lmcache_instance_id"] for e in engines] == names
        for e in engines:
            info = controller.post("/query_worker_info", {"instance_id": e["name"]})
            # The controller knows each engine by its own loopback ip (its port is the LMCache worker port).
            assert [(w["ip"], w["port"]) for w in info["worker_infos"]] == [(e["ip"], e["lmcache_worker_port"])]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        def deregistered(instance_id: str) -> bool:
            return not controller.post("/query_worker_info", {"instance_id": instance_id})["worker_infos"]

        # the DeRegisterMsg is a PUSH: the controller handles it after the process is gone
        for name in names:
            wait_until(functools.partial(deregistered, name), message=f"{name} deregistered")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
