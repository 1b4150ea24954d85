"""The demo's client of the running stack: requests through Envoy, decisions, LMCache credit, checks."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from demo.explain import explain
from demo.prompts import CHUNK
from sim.tokenization import SimTokenizer
from testkit.sidecar import SidecarProc
from testkit.stack import Stack


def debug_url_of(sidecar: SidecarProc | None, metrics_url: str) -> str:
    """Where a sidecar serves /debug/*: its admin HTTP listener (--admin-http-listen) when it has one, else
    (sidecars from before that listener) its metrics port."""
    url = getattr(sidecar, "debug_url", None)
    return str(url) if url else metrics_url


def heading(n: int, title: str) -> None:
    print(f"\n== Step {n}: {title}", flush=True)


class DemoFailure(Exception):
    """A step did not behave as the storyline says."""


@dataclass
class Reply:
    status: int
    served_by: str
    request_id: str
    text: str


@dataclass
class DemoSession:
    """The demo's view of the running stack: traffic through Envoy, the sidecar's own record of each
    decision, the LMCache controller's credit, the engines' test hooks; and the tally of checks."""

    stack: Stack
    session: aiohttp.ClientSession
    tok: SimTokenizer
    beta: float
    names: dict[str, str]  # endpoint ip:port -> engine name
    urls: dict[str, str]  # engine name -> http://ip:port
    metrics_url: str  # the sidecar's /metrics
    debug_url: str  # the sidecar's /debug/decisions and /debug/state
    failures: list[str] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)
    _seq: int = 0

    # ---- small helpers -----------------------------------------------------------------------------------
    def check(self, ok: bool, what: str) -> bool:
        print(f"   {'ok  ' if ok else 'FAIL'}: {what}", flush=True)
        if not ok:
            self.failures.append(what)
        return ok

    def name(self, endpoint: str | None) -> str:
        if endpoint is None:
            return "none"
        return self.names.get(endpoint, endpoint)

    def endpoint_of(self, name: str) -> str:
        return next(ep for ep, n in self.names.items() if n == name)

    async def get_json(self, url: str) -> Any:
        async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            resp.raise_for_status()
            return await resp.json(content_type=None)

    async def post_json(self, url: str, body: Any) -> Any:
        async with self.session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            resp.raise_for_status()
            return await resp.json(content_type=None)

    async def get_text(self, url: str) -> str:
        async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            resp.raise_for_status()
            return await resp.text()

    async def wait_for(self, what: str, probe: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if await probe():
                    return True
            except (TimeoutError, aiohttp.ClientError, KeyError, ValueError):
                pass
            if time.monotonic() >= deadline:
                return self.check(False, f"{what} within {timeout:.0f}s")
            await asyncio.sleep(0.05)

    # ---- traffic through Envoy -----------------------------------------------------------------------------
    def new_request_id(self) -> str:
        """The `x-request-id` of the demo's next request: the key of its decision in /debug/decisions."""
        self._seq += 1
        return f"demo-{self._seq:03d}-{random.getrandbits(32):08x}"

    async def send(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
        request_id = self.new_request_id()
        hdrs = {"x-request-id": request_id, **(headers or {})}
        async with self.session.post(f"{self.stack.url}{path}", json=body, headers=hdrs,
                                     timeout=aiohttp.ClientTimeout(total=30)) as resp:
            if body.get("stream"):
                text = b"".join([line async for line in resp.content]).decode(errors="replace")
                if resp.status == 200 and "data: [DONE]" not in text:
                    raise DemoFailure(f"{request_id}: stream ended without [DONE]")
            else:
                text = await resp.text()
            return Reply(resp.status, resp.headers.get("x-served-by", "?"), request_id, text)

    async def send_get(self, path: str) -> Reply:
        request_id = self.new_request_id()
        async with self.session.get(f"{self.stack.url}{path}", headers={"x-request-id": request_id},
                                    timeout=aiohttp.ClientTimeout(total=30)) as resp:
            return Reply(resp.status, resp.headers.get("x-served-by", "?"), request_id, await resp.text())

    async def decisions(self, n: int = 256, debug_url: str | None = None) -> list[dict[str, Any]]:
        """The sidecar's latest `n` decisions (another sidecar's with `debug_url`)."""
        return list(await self.get_json(f"{debug_url or self.debug_url}/debug/decisions?n={n}"))

    async def decision_for(self, request_id: str, debug_url: str | None = None) -> dict[str, Any]:
        for _ in range(20):
            for d in reversed(await self.decisions(64, debug_url)):
                if d.get("request_id") == request_id:
                    return d
            await asyncio.sleep(0.05)
        raise DemoFailure(f"the sidecar recorded no decision for {request_id} (is Envoy passing x-request-id?)")

    async def lmcache_holders(self, tokens: list[int]) -> dict[str, int]:
        """Instance id -> tokens credited, straight from the controller (what the sidecar will see)."""
        assert self.stack.lmcache is not None
        data = await self.post_json(f"{self.stack.lmcache.url}/lookup", {"tokens": tokens})
        return {iid: int(v[1]) for iid, v in (data.get("layout_info") or {}).items()}

    async def wait_cached(self, tokens: list[int], holder: str) -> None:
        want = (len(tokens) // CHUNK) * CHUNK

        async def probe() -> bool:
            return (await self.lmcache_holders(tokens)).get(holder, 0) >= want

        if await self.wait_for(f"LMCache credits {holder} with {want} tokens", probe):
            print(f"   LMCache controller now credits {holder} with {want} tokens "
                  f"({want // CHUNK} chunks of {CHUNK})", flush=True)

    async def scraped_running(self, endpoint: str) -> float | None:
        state = await self.get_json(f"{self.debug_url}/debug/state")
        for e in state["endpoints"]:
            if e["endpoint"] == endpoint:
                return None if e["scraped"] is None else float(e["scraped"]["running"])
        return None

    async def set_phantom(self, engine: str, running: int) -> None:
        await self.post_json(f"{self.urls[engine]}/sim/phantom_load", {"running": running, "waiting": 0})
        ep = self.endpoint_of(engine)

        async def seen() -> bool:
            r = await self.scraped_running(ep)
            return r is not None and (r >= running if running else r == 0)

        t = time.monotonic()
        print(f"   POST {self.urls[engine]}/sim/phantom_load {{\"running\": {running}, \"waiting\": 0}}", flush=True)
        if await self.wait_for(f"the sidecar scrapes running={running} on {engine}", seen):
            print(f"   sidecar's scrape of {engine} shows running={running} after {time.monotonic() - t:.2f}s",
                  flush=True)

    async def step_request(self, path: str, body: dict[str, Any], label: str,
                           headers: dict[str, str] | None = None) -> tuple[Reply, dict[str, Any]]:
        hdr = "".join(f" [{k}: {v}]" for k, v in (headers or {}).items())
        print(f"   POST {path} {label}{hdr}", flush=True)
        reply = await self.send(path, body, headers)
        d = await self.decision_for(reply.request_id)
        explain(d, reply.served_by, reply.status, self.name, self.beta)
        self.check(reply.status == 200, f"HTTP 200 (got {reply.status})")
        self.check(reply.served_by == self.name(d["endpoint"]),
                   f"served by the engine the sidecar chose ({reply.served_by} == {self.name(d['endpoint'])})")
        return reply, d


# ---- prompts ---------------------------------------------------------------------------------------------
