"""`make demo`: the whole routing path on loopback, driven through a short storyline.

    .venv/bin/python -m sim.demo [--log-dir out/demo/logs] [--beta 1.0]

Starts a real LMCache controller, three simulated vLLM engines, the loadaware sidecar and a real Envoy
(sim.stack.Stack), sends traffic through Envoy at :10000 and, for every step, prints where the request went
and why, from the sidecar's own record of the decision (GET /debug/decisions): per engine the matched /
prompt tokens, the load and the score of

    score(i) = min(1, matched(i) / prompt) - beta * (load(i) - mean_load) / max(1, mean_load)

Every step checks what it claims. A failed check prints `FAIL: ...`; the run then ends with `DEMO FAILED`
and exit code 1, otherwise with `DEMO OK` and exit code 0, so tests can rely on the output. Everything is
stopped on exit, Ctrl-C and SIGTERM included; process logs go to out/demo/logs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp

from sim.make_tokenizer import WORDS
from sim.stack import (ENVOY_ADMIN_PORT, ENVOY_LISTEN_PORT, REPO, SIDECAR_PORT, TINY_TOKENIZER,
                       LMCacheControllerProc, ProcError, Stack, free_port, loopback_lock)
from sim.tokenization import SimTokenizer

DEFAULT_LOG_DIR = REPO / "out" / "demo" / "logs"
MODEL = "tiny-model"
DEST_HEADER = "x-gateway-destination-endpoint"
CHUNK = 256  # LMCache chunk size in tokens
PHANTOM_RUNNING = 12


class DemoFailure(Exception):
    """A step did not behave as the storyline says."""


@dataclass
class Reply:
    status: int
    served_by: str
    request_id: str
    text: str


@dataclass
class Demo:
    stack: Stack
    session: aiohttp.ClientSession
    tok: SimTokenizer
    beta: float
    names: dict[str, str]  # endpoint ip:port -> engine name
    urls: dict[str, str]  # engine name -> http://ip:port
    metrics_url: str
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
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError):
                pass
            if time.monotonic() >= deadline:
                return self.check(False, f"{what} within {timeout:.0f}s")
            await asyncio.sleep(0.05)

    # ---- traffic through Envoy -----------------------------------------------------------------------------
    async def send(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
        self._seq += 1
        request_id = f"demo-{self._seq:03d}-{random.getrandbits(32):08x}"
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

    async def decisions(self, n: int = 256) -> list[dict[str, Any]]:
        return list(await self.get_json(f"{self.metrics_url}/debug/decisions?n={n}"))

    async def decision_for(self, request_id: str) -> dict[str, Any]:
        for _ in range(20):
            for d in reversed(await self.decisions(64)):
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
        state = await self.get_json(f"{self.metrics_url}/debug/state")
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

    # ---- explaining one decision -------------------------------------------------------------------------
    def explain(self, d: dict[str, Any], reply: Reply) -> None:
        cands = d["candidates"]
        prompt = int(d["prompt_tokens"])
        loads = [float(c["load"]) for c in cands]
        mean = sum(loads) / len(loads) if loads else 0.0
        scale = max(1.0, mean)
        print(f"   -> {reply.served_by} (HTTP {reply.status}; sidecar chose {self.name(d['endpoint'])}, "
              f"outcome {d['outcome']}, decided in {d['total_ms']:.2f} ms)", flush=True)
        print(f"      {'engine':<10} {'endpoint':<15} {'matched/prompt':>15} {'benefit':>8} {'load':>6} "
              f"{'rel.load':>9} {'score':>7}", flush=True)
        for c in cands:
            benefit = min(1.0, c["matched_tokens"] / prompt) if prompt else 0.0
            rel = (float(c["load"]) - mean) / scale
            mark = "  <= chosen" if c["endpoint"] == d["endpoint"] else ""
            print(f"      {self.name(c['endpoint']):<10} {c['endpoint']:<15} "
                  f"{c['matched_tokens']:>7}/{prompt:<7} {benefit:>8.3f} {float(c['load']):>6.1f} "
                  f"{rel:>+9.3f} {float(c['score']):>+7.3f}{mark}", flush=True)
        print(f"      why: {self.why(d, mean)}", flush=True)

    def why(self, d: dict[str, Any], mean: float) -> str:
        cands = d["candidates"]
        prompt = int(d["prompt_tokens"])
        if d["outcome"] != "routed":
            return f"fallback ({', '.join(d['reasons'])}): load term only"
        chosen = next(c for c in cands if c["endpoint"] == d["endpoint"])
        best_match = max(cands, key=lambda c: c["matched_tokens"])
        scale = max(1.0, mean)
        if best_match["matched_tokens"] == 0:
            if len({round(float(c["score"]), 9) for c in cands}) == 1:
                return (f"no engine holds any of the {prompt} tokens and loads are equal: every score ties at "
                        f"{float(chosen['score']):+.3f}; the tie-break (longer match, lower load, then endpoint) "
                        f"picks {self.name(chosen['endpoint'])}")
            return f"no prefix anywhere: the least loaded engine wins ({float(chosen['score']):+.3f})"
        if best_match["endpoint"] == chosen["endpoint"]:
            return (f"{self.name(chosen['endpoint'])} holds {chosen['matched_tokens']}/{prompt} tokens "
                    f"(benefit {min(1.0, chosen['matched_tokens'] / prompt):.3f}) at load "
                    f"{float(chosen['load']):g} vs fleet mean {mean:.2f}: highest score "
                    f"{float(chosen['score']):+.3f}")
        b = min(1.0, best_match["matched_tokens"] / prompt)
        rel_h = (float(best_match["load"]) - mean) / scale
        bc = min(1.0, chosen["matched_tokens"] / prompt)
        rel_c = (float(chosen["load"]) - mean) / scale
        return (f"holder {self.name(best_match['endpoint'])}: {b:.3f} - {self.beta:g}*({float(best_match['load']):g}"
                f"-{mean:.2f})/{scale:.2f} = {b:.3f} - {self.beta * rel_h:.3f} = {float(best_match['score']):+.3f}; "
                f"{self.name(chosen['endpoint'])}: {bc:.3f} - {self.beta:g}*({float(chosen['load']):g}-{mean:.2f})"
                f"/{scale:.2f} = {float(chosen['score']):+.3f} -> load outweighs the cached prefix")

    async def step_request(self, path: str, body: dict[str, Any], label: str,
                           headers: dict[str, str] | None = None) -> tuple[Reply, dict[str, Any]]:
        hdr = "".join(f" [{k}: {v}]" for k, v in (headers or {}).items())
        print(f"   POST {path} {label}{hdr}", flush=True)
        reply = await self.send(path, body, headers)
        d = await self.decision_for(reply.request_id)
        self.explain(d, reply)
        self.check(reply.status == 200, f"HTTP 200 (got {reply.status})")
        self.check(reply.served_by == self.name(d["endpoint"]),
                   f"served by the engine the sidecar chose ({reply.served_by} == {self.name(d['endpoint'])})")
        return reply, d


# ---- prompts ---------------------------------------------------------------------------------------------


def prefix_text(tok: SimTokenizer, seed: int, target_tokens: int) -> str:
    """Words until the text is about `target_tokens` tokens long (the tiny vocabulary is ~1 token/word)."""
    rng = random.Random(seed)
    text = f"Document {seed}."
    while len(tok.encode_prompt(text)) < target_tokens:
        text += " " + " ".join(rng.choice(WORDS) for _ in range(32))
    return text


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def chunk_aligned(tok: SimTokenizer, text: str, encode_pair: Callable[[str], tuple[list[int], list[int]]]) -> str:
    """Pad `text` with one-token words until the token prefix two requests built from it share ends on a
    256-token chunk boundary. LMCache never matches a partial chunk, so this makes the demo's benefit ~1
    instead of (whole chunks)/(prompt)."""
    base = tok.encode_prompt("x")
    fillers = [w for w in WORDS if len(tok.encode_prompt("x " + w)) == len(base) + 1] or ["the"]
    rng = random.Random(len(text))
    for _ in range(2 * CHUNK):
        shared = common_prefix(*encode_pair(text))
        if shared and shared % CHUNK == 0:
            return text
        text += " " + rng.choice(fillers)
    return text


def heading(n: int, title: str) -> None:
    print(f"\n== Step {n}: {title}", flush=True)


def summarize(text: str, n_tokens: int) -> str:
    return f"<{n_tokens} tokens: {text[:32]!r}...{text[-30:]!r}>"


# ---- the storyline ---------------------------------------------------------------------------------------


async def storyline(demo: Demo) -> None:
    tok = demo.tok
    engines = sorted(demo.urls)
    print(f"fleet: {', '.join(f'{n}={demo.endpoint_of(n)}' for n in engines)}; "
          f"policy loadaware, beta={demo.beta:g}; Envoy at {demo.stack.url}", flush=True)

    # 1. cold prompt
    heading(1, "a cold prompt with a long shared prefix")
    suffixes = (" First question: what is cached where?", " Second question: which engine holds it now?",
                " Fourth question: what if the holder is busy?")
    shared = chunk_aligned(tok, prefix_text(tok, 1, 1500),
                           lambda t: (tok.encode_prompt(t + suffixes[0]), tok.encode_prompt(t + suffixes[1])))
    p1 = shared + suffixes[0]
    t1 = tok.encode_prompt(p1)
    r1, d1 = await demo.step_request("/v1/completions", {"model": MODEL, "prompt": p1, "max_tokens": 8},
                                     summarize(p1, len(t1)))
    demo.check(all(c["matched_tokens"] == 0 for c in d1["candidates"]), "no engine held any of it (cold)")
    holder = r1.served_by
    demo.facts["step1"] = holder
    await demo.wait_cached(t1, holder)

    # 2. same prefix, new suffix
    heading(2, "same prefix, new suffix -> the engine that holds it")
    p2 = shared + suffixes[1]
    r2, d2 = await demo.step_request("/v1/completions", {"model": MODEL, "prompt": p2, "max_tokens": 8},
                                     summarize(p2, len(tok.encode_prompt(p2))))
    m2 = max(c["matched_tokens"] for c in d2["candidates"])
    demo.check(r2.served_by == holder, f"went to the holder {holder} (got {r2.served_by})")
    demo.check(m2 / max(1, d2["prompt_tokens"]) > 0.9, f"benefit ~1 ({m2}/{d2['prompt_tokens']})")
    demo.facts["step2"] = r2.served_by

    # 3. chat, twice
    heading(3, "chat requests with a long system message (the sidecar applies the chat template)")
    users = ("Summarize the document.", "List three key terms.")

    def chat(system: str, user: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    system = chunk_aligned(tok, prefix_text(tok, 3, 1500),
                           lambda t: (tok.encode_chat(chat(t, users[0])), tok.encode_chat(chat(t, users[1]))))
    msgs_a = chat(system, users[0])
    ta = tok.encode_chat(msgs_a)
    r3a, _ = await demo.step_request("/v1/chat/completions", {"model": MODEL, "messages": msgs_a, "max_tokens": 8},
                                     f"system {summarize(system, len(tok.encode_prompt(system)))} + user #1 "
                                     f"({len(ta)} tokens templated)")
    chat_holder = r3a.served_by
    await demo.wait_cached(ta, chat_holder)
    msgs_b = chat(system, users[1])
    print("   second chat request: same system message, another user turn, streamed", flush=True)
    r3b, d3b = await demo.step_request("/v1/chat/completions",
                                       {"model": MODEL, "messages": msgs_b, "max_tokens": 8, "stream": True},
                                       f"system <same> + user #2 ({len(tok.encode_chat(msgs_b))} tokens templated)")
    m3 = next(c["matched_tokens"] for c in d3b["candidates"] if c["endpoint"] == d3b["endpoint"])
    demo.check(r3b.served_by == chat_holder and m3 / max(1, d3b["prompt_tokens"]) > 0.9,
               f"followed its prefix to {chat_holder} ({m3}/{d3b['prompt_tokens']} tokens matched after templating)")
    demo.facts["step3"] = f"{chat_holder},{r3b.served_by}"

    # 4. the holder looks loaded
    heading(4, f"the holder {holder} looks loaded ({PHANTOM_RUNNING} running) -> load beats locality")
    await demo.set_phantom(holder, PHANTOM_RUNNING)
    p4 = shared + suffixes[2]
    r4, d4 = await demo.step_request("/v1/completions", {"model": MODEL, "prompt": p4, "max_tokens": 8},
                                     summarize(p4, len(tok.encode_prompt(p4))))
    hc = next(c for c in d4["candidates"] if demo.name(c["endpoint"]) == holder)
    demo.check(hc["matched_tokens"] > 0, f"{holder} still holds the prefix ({hc['matched_tokens']} tokens)")
    demo.check(r4.served_by != holder, f"moved away from the loaded holder {holder} (to {r4.served_by})")
    demo.facts["step4"] = f"{r4.served_by} holder={holder}"
    print("   clearing the phantom load:", flush=True)
    await demo.set_phantom(holder, 0)

    # 5. a spoofed routing header
    heading(5, f"a client-supplied {DEST_HEADER} header is ignored")
    spoof_name = next(n for n in engines if n != chat_holder)
    spoof = demo.endpoint_of(spoof_name)
    msgs_c = chat(system, "Route me to " + spoof_name)
    r5, _ = await demo.step_request("/v1/chat/completions", {"model": MODEL, "messages": msgs_c, "max_tokens": 8},
                                    "system <same as step 3> + user #3", headers={DEST_HEADER: spoof})
    honoured = r5.served_by == spoof_name
    demo.check(not honoured, f"the client's choice {spoof_name} was not honoured")
    demo.check(r5.served_by == chat_holder, f"the sidecar's choice stood: the prefix holder {chat_holder}")
    demo.facts["step5"] = f"{r5.served_by} spoofed={spoof_name} honoured={'yes' if honoured else 'no'}"

    # 6. burst
    await burst(demo)


async def burst(demo: Demo, n_requests: int = 60, n_prefixes: int = 16, concurrency: int = 8) -> None:
    heading(6, f"a burst: {n_requests} mixed requests over {n_prefixes} prefixes, {concurrency} at a time")
    tok = demo.tok
    rng = random.Random(6)
    prefixes = [prefix_text(tok, 100 + i, 1000) for i in range(n_prefixes)]
    # Skewed popularity (Zipf-like): a few hot prefixes and a tail; every prefix at least once.
    weights = [1.0 / (i + 1) ** 0.9 for i in range(n_prefixes)]
    picks = list(range(n_prefixes)) + rng.choices(range(n_prefixes), weights, k=n_requests - n_prefixes)
    rng.shuffle(picks)
    jobs: list[tuple[str, dict[str, Any]]] = []
    for k, i in enumerate(picks):
        stream = k % 2 == 0
        if k % 3 == 0:
            jobs.append(("/v1/chat/completions", {"model": MODEL, "max_tokens": 16, "stream": stream, "messages": [
                {"role": "system", "content": prefixes[i]}, {"role": "user", "content": f"request {k}"}]}))
        else:
            jobs.append(("/v1/completions", {"model": MODEL, "max_tokens": 16, "stream": stream,
                                             "prompt": prefixes[i] + f" request {k}"}))
    n_stream = sum(1 for _, b in jobs if b["stream"])
    n_chat = sum(1 for p, _ in jobs if "chat" in p)
    print(f"   {n_chat} chat + {n_requests - n_chat} completions, {n_stream} streamed; "
          f"prefixes of ~{len(tok.encode_prompt(prefixes[0]))} tokens, Zipf-like popularity", flush=True)
    sem = asyncio.Semaphore(concurrency)

    async def one(path: str, body: dict[str, Any]) -> Reply:
        async with sem:
            return await demo.send(path, body)

    t0 = time.monotonic()
    replies = await asyncio.gather(*(one(p, b) for p, b in jobs))
    elapsed = time.monotonic() - t0
    ids = {r.request_id for r in replies}
    decisions = {d["request_id"]: d for d in await demo.decisions(256) if d["request_id"] in ids}
    by_engine = Counter(r.served_by for r in replies)
    ok = sum(1 for r in replies if r.status == 200)
    agree = sum(1 for r in replies if r.request_id in decisions
                and demo.name(decisions[r.request_id]["endpoint"]) == r.served_by)
    with_match = sum(1 for d in decisions.values() if any(c["matched_tokens"] > 0 for c in d["candidates"]))
    routed = sum(1 for d in decisions.values() if d["outcome"] == "routed")
    frac = with_match / max(1, len(decisions))
    print(f"   done in {elapsed:.2f}s", flush=True)
    print(f"      {'engine':<10} {'requests':>8}", flush=True)
    for name in sorted(demo.urls):
        print(f"      {name:<10} {by_engine.get(name, 0):>8}", flush=True)
    print(f"   decisions with a non-empty LMCache match: {with_match}/{len(decisions)} = {frac:.2f} "
          f"(at most {n_requests - n_prefixes}: each prefix's first request is cold, and so is a repeat "
          f"sent while its first is still running)", flush=True)
    demo.check(ok == n_requests, f"{ok}/{n_requests} HTTP 200")
    demo.check(len(decisions) == n_requests and agree == n_requests,
               f"{agree}/{n_requests} served by the engine the sidecar chose")
    demo.check(routed == len(decisions), f"{routed}/{len(decisions)} decisions routed (no fallback)")
    demo.check(frac >= 0.4, f"most repeat requests found their prefix ({frac:.2f} >= 0.40)")
    demo.check(len(by_engine) == len(demo.urls), "every engine got traffic")
    demo.facts["burst"] = f"{ok}/{n_requests} match_fraction={frac:.2f} " + ",".join(
        f"{n}:{by_engine.get(n, 0)}" for n in sorted(demo.urls))

    # Whole-run accounting from the sidecar's /metrics and /debug/state.
    metrics = await demo.get_text(f"{demo.metrics_url}/metrics")
    fallbacks = metric_sum(metrics, "loadaware_fallbacks_total")
    decided = metric_sum(metrics, "loadaware_decisions_total")
    print(f"   /metrics: loadaware_decisions_total={decided:g} loadaware_fallbacks_total={fallbacks:g}", flush=True)
    for line in metric_lines(metrics, "loadaware_prefix_match_fraction")[:4]:
        print(f"   /metrics: {line}", flush=True)
    demo.check(fallbacks == 0, f"no fallbacks during the whole run (loadaware_fallbacks_total={fallbacks:g})")
    demo.facts["fallbacks"] = f"{fallbacks:g}"

    state: dict[str, Any] = {}

    async def drained() -> bool:
        nonlocal state
        state = await demo.get_json(f"{demo.metrics_url}/debug/state")
        return int(state["inflight_total"]) == 0

    await demo.wait_for("in-flight counts back at 0", drained, timeout=3.0)
    per = {demo.name(e["endpoint"]): e["inflight"] for e in state.get("endpoints", [])}
    total = int(state.get("inflight_total", -1))
    running = {}
    for name, url in sorted(demo.urls.items()):
        st = await demo.get_json(f"{url}/sim/state")
        running[name] = int(st["running"]) + int(st["waiting"])
    print(f"   sidecar in-flight after the burst: total={total} {per}; "
          f"engines running+waiting: {running}", flush=True)
    demo.check(total == 0 and not any(running.values()), "in-flight back at 0 everywhere")
    demo.facts["inflight"] = str(total)


def metric_lines(text: str, name: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(name)]


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for ln in metric_lines(text, name):
        m = re.match(rf"{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)", ln)
        if m:
            total += float(m.group(2))
    return total


# ---- entry point -----------------------------------------------------------------------------------------


async def run(stack: Stack, metrics_url: str, beta: float) -> Demo:
    assert stack.fleet is not None
    names = {f"{e['ip']}:{e['port']}": str(e["name"]) for e in stack.fleet.engines}
    urls = {str(e["name"]): str(e["url"]) for e in stack.fleet.engines}
    tok = SimTokenizer(TINY_TOKENIZER)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        demo = Demo(stack, session, tok, beta, names, urls, metrics_url)

        async def sidecar_ready() -> bool:
            return bool((await demo.get_json(f"{metrics_url}/debug/state")).get("ready"))

        try:
            if await demo.wait_for(f"the sidecar's {metrics_url}/debug/state says ready", sidecar_ready, 15.0):
                await storyline(demo)
        except DemoFailure as e:
            demo.check(False, str(e))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, KeyError, ValueError) as e:
            demo.check(False, f"unexpected {type(e).__name__}: {e}")
        return demo


FIXED_ADDRESSES = (("127.0.0.1", ENVOY_LISTEN_PORT), ("127.0.0.1", ENVOY_ADMIN_PORT), ("127.0.0.1", SIDECAR_PORT),
                   ("127.0.0.2", 8000), ("127.0.0.3", 8000), ("127.0.0.4", 8000))


def busy_fixed_addresses() -> list[str]:
    """The shipped fixed addresses something already listens on (another run on this machine)."""
    busy = []
    for host, port in FIXED_ADDRESSES:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.2)
            if s.connect_ex((host, port)) == 0:
                busy.append(f"{host}:{port}")
    return busy


def start_stack(log_dir: Path, sidecar_args: list[str], attempts: int = 4, wait_s: float = 120.0) -> Stack:
    """Start the stack once the fixed addresses are free; retry when another run grabbed one meanwhile.

    A readiness probe that answers does not prove that *our* process answered (a foreign sidecar on :9002
    passes the health check), so after the start every process must still be alive."""
    for attempt in range(1, attempts + 1):
        t_wait = time.monotonic()
        # Runs that use sim.stack queue on its cross-process lock; others are seen by their listening ports.
        with loopback_lock(timeout=600.0):
            deadline = time.monotonic() + wait_s
            while busy := busy_fixed_addresses():
                if time.monotonic() >= deadline:
                    raise ProcError(f"addresses still in use by another run after {wait_s:.0f}s: "
                                    f"{', '.join(busy)}")
                time.sleep(1.0)
            waited = time.monotonic() - t_wait
            if waited > 0.5:
                print(f"   waited {waited:.1f}s for another run on this machine to free the shared ports",
                      flush=True)
            stack = Stack(log_dir, engines=3, lmcache=True, sidecar_args=sidecar_args)
            t0 = time.monotonic()
            try:
                stack.start()  # takes the (reentrant) lock too and keeps it until stack.stop()
                time.sleep(0.3)
                dead = [p for p in stack.procs() if not p.running]
                if dead:
                    raise ProcError("exited right after start: " + ", ".join(p.name for p in dead) + "\n"
                                    + "\n".join(p.log_tail(8) for p in dead))
            except ProcError as e:
                stack.stop()
                if "in use" in str(e) and attempt < attempts:
                    print(f"   start attempt {attempt} lost a port to another run; retrying ...", flush=True)
                    time.sleep(2.0)
                    continue
                raise
            except BaseException:
                stack.stop()
                raise
        print(f"stack up in {time.monotonic() - t0:.1f}s", flush=True)
        return stack
    raise ProcError("could not start the stack")


def experiment_section(out: Path, point_name: str) -> str:
    """The closing short version of the reference experiment (experiment/realtime/demo_run.py): a fresh
    fleet, Envoy, sidecar per arm; prints the per-arm table. Returns "ok", or "skipped" without numpy."""
    try:
        from experiment.realtime.demo_run import DEMO_ARMS, DEMO_SEEDS, demo_point, run_demo_experiment
    except ImportError as e:  # the experiment extra (numpy) is not installed in this environment
        print(f"\n(short experiment skipped: {e}; `make experiment` installs what it needs)", flush=True)
        return "skipped"
    point = demo_point(point_name)
    wl = point.workload
    print(f"\n== Experiment (short, {point.name} point): seeds {DEMO_SEEDS}, arms {DEMO_ARMS}", flush=True)
    print(f"   {point.engines} engines, {wl.rate:g} req/s, ~{wl.prefix_tokens + wl.suffix_tokens:,}-token prompts over "
          f"{wl.n_prefixes} Zipf({wl.zipf_s:g}) prefixes, {wl.warmup_passes} warm-up pass(es), {wl.n_requests} "
          "measured requests per seed (`make experiment` runs 500 x 20 seeds, every arm and both peer routers)", flush=True)
    table = run_demo_experiment(out, point_name)
    print("\nmedians over seeds (imbalance = busiest / idlest mean running; SLO = TTFT <= 150 ms):", flush=True)
    print(table, flush=True)
    return "ok"


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.demo", description="loadaware routing demo")
    parser.add_argument("--log-dir", type=Path, default=DEFAULT_LOG_DIR)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--no-experiment", action="store_true",
                        help="skip the closing short experiment (2 seeds x 3 arms, ~4 min)")
    parser.add_argument("--experiment-point", choices=("reference", "tiny"), default="reference",
                        help="the short experiment's operating point (tiny: seconds, for tests)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)  # stop the stack on SIGTERM as on Ctrl-C
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
    if not LMCacheControllerProc.available():
        print("DEMO FAILED: the LMCache controller is not installed; run `make lmcache` first", flush=True)
        return 2
    metrics_port = free_port()
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    sidecar_args = ["--metrics-listen", f"127.0.0.1:{metrics_port}", "--scrape-interval-s", "0.25",
                    "--policy", "loadaware", "--loadaware-beta", str(args.beta), "--log-level", "WARNING"]
    t0 = time.monotonic()
    print(f"starting LMCache controller + 3 simulated engines + sidecar + Envoy (logs: {args.log_dir}) ...",
          flush=True)
    demo: Demo | None = None
    stack: Stack | None = None
    try:
        stack = start_stack(args.log_dir, sidecar_args)
        demo = asyncio.run(run(stack, metrics_url, args.beta))
        print("\nstopping the stack ...", flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the stack", flush=True)
        return 130
    except ProcError as e:
        print(f"\nDEMO FAILED: the stack did not start:\n{e}", flush=True)
        return 1
    finally:
        if stack is not None:
            stack.stop()
    experiment = "skipped"
    if not args.no_experiment and not demo.failures:
        try:
            experiment = experiment_section(args.log_dir / "experiment", args.experiment_point)
        except KeyboardInterrupt:
            print("\ninterrupted: the experiment stopped its processes", flush=True)
            return 130
        except (ProcError, OSError, RuntimeError) as e:
            demo.check(False, f"the short experiment did not run: {e}")
    elapsed = time.monotonic() - t0
    f = demo.facts
    print(f"\nsummary: step1={f.get('step1')} step2={f.get('step2')} step3={f.get('step3')} "
          f"step4={f.get('step4')} step5={f.get('step5')} burst={f.get('burst')} "
          f"fallbacks={f.get('fallbacks')} inflight={f.get('inflight')} experiment={experiment} "
          f"elapsed={elapsed:.1f}s", flush=True)
    if demo.failures:
        print(f"DEMO FAILED: {len(demo.failures)} check(s) failed: " + "; ".join(demo.failures), flush=True)
        return 1
    print("DEMO OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
