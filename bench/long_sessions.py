"""Case `long_prompts`'s two session cases (`python -m bench.long_prompts --cases conversation,new_user`).

**conversation**: chat sessions that grow turn by turn to `final_kb` (each request re-sends the whole history plus
a new turn), `sessions` of them at once, through Envoy BUFFERED (envoy/envoy.yaml) and the picker
(envoy/envoy-inference-pool.yaml) with the sidecar as shipped, against `direct`, on the null engines. Each arm gets
sessions of its own. A session opens with the shared system prompt and is first grown to `final_kb - turns *
turn_kb` in turns of `warm_turn_kb` at `warm_concurrency` (the way in: not measured); then every session at once,
one worker each, sends its `turns` measured turns of `turn_kb` (the engine's previous reply, now history, and a new
user message), in order. Printed per arm: TTFT p50 and p99 over the measured turns (and added over `direct`),
the last turn's p99, the sidecar's CPU and decision stages per measured request, the conversation cache's hits
and misses and the requests decided without their tokens over the measured turns.

**new_user**: the case tried as a new user would: `documents` shared documents of `doc_kb`, each request one of
them and a question of its own (completions, streamed, `max_tokens` 8), `requests` in a closed loop at
`concurrency`, on three fast simulated engines (`sim.fleet` with bench.cases.FAST_FLEET: they tokenize every
prompt as vLLM does, and compute nothing else) through the shipped BUFFERED Envoy and sidecar, against the same
requests sent straight to the engines (round robin). Printed: TTFT p50 and p99 per arm, what the gateway adds
to the direct p99 (in per cent), the sidecar's CPU per request. The simulated engines read the tiny tokenizer
from a copy whose `model_max_length` admits the documents (the shipped one stops at 32k tokens).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from testkit.fleet import FleetProc
from testkit.metrics_text import metric_sum
from testkit.paths import TINY_TOKENIZER
from testkit.procs import ManagedProc
from testkit.sidecar import SidecarProc

from .cases import FAST_FLEET
from .long_prompts import (
    CLIENT_TIMEOUT_S,
    WORDS,
    ArmFigures,
    cpu_seconds,
    gateway,
    one,
    prompt_of,
    stage_sums,
)
from .stats import percentile

log = logging.getLogger("bench.long_prompts")

ARMS = ("direct", "buffered", "full_duplex")
SYSTEM = "You are a careful assistant. Answer from the conversation's documents; cite the passage you use. " * 10
# Room for the conversation case's sessions at 220 KB with the tiny tokenizer (~2.3 characters a token: ~0.4 MB of
# ids a session; the default 32 MiB holds ~80 of them, and 150 sessions cycling through an LRU would never hit).
CONVERSATION_SIDECAR_ARGS = ("--conversation-cache-mb", "128")


@dataclass(frozen=True)
class ConversationShape:
    sessions: int = 150
    final_kb: int = 220
    turns: int = 10  # measured turns
    turn_kb: float = 2.0  # each measured turn: the previous reply and a new user message
    warm_turn_kb: int = 40
    warm_concurrency: int = 4


def text_of(rng: random.Random, size: int, head: str) -> str:
    words = [head]
    total = len(head)
    while total < size:
        w = rng.choice(WORDS)
        words.append(w)
        total += len(w) + 1
    return " ".join(words)


@dataclass
class Session:
    n: int
    rng: random.Random = field(init=False)
    messages: list[dict[str, str]] = field(default_factory=lambda: [{"role": "system", "content": SYSTEM}])
    chars: int = len(SYSTEM)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.n)

    def add(self, role: str, size: int) -> None:
        content = text_of(self.rng, size, f"session {self.n} turn {len(self.messages)}:")
        self.messages.append({"role": role, "content": content})
        self.chars += len(content)

    def body(self) -> bytes:
        return json.dumps({"model": "tiny-model", "messages": self.messages, "max_tokens": 1,
                           "stream": True}).encode()


async def _turn(http: aiohttp.ClientSession, url: str, session: Session, user_bytes: int, reply_bytes: int,
                figures: ArmFigures) -> None:
    """One turn: the engine's previous reply (if any) becomes history, a new user message, the request."""
    if session.messages[-1]["role"] == "user":
        session.add("assistant", reply_bytes)
    session.add("user", user_bytes)
    await one(http, url, session.body(), figures)


async def warm(urls: list[str], sessions: list[Session], shape: ConversationShape, figures: ArmFigures) -> None:
    """Each session grown to its opening size in turns of warm_turn_kb, warm_concurrency sessions at a time."""
    opening = (shape.final_kb - shape.turns * shape.turn_kb) * 1024
    queue: asyncio.Queue[Session] = asyncio.Queue()
    for s in sessions:
        queue.put_nowait(s)
    async with _client(shape.warm_concurrency) as http:
        async def worker() -> None:
            while not queue.empty():
                s = queue.get_nowait()
                while s.chars < opening:
                    size = int(min(shape.warm_turn_kb * 1024, opening - s.chars))
                    await _turn(http, urls[s.n % len(urls)], s, size, 512, figures)
        await asyncio.gather(*(worker() for _ in range(shape.warm_concurrency)))


async def measured_turns(urls: list[str], sessions: list[Session], shape: ConversationShape,
                         figures: ArmFigures, last: ArmFigures) -> None:
    """Every session at once, one worker each, its measured turns in order (the last one's TTFT apart too)."""
    half = int(shape.turn_kb * 1024 / 2)
    async with _client(len(sessions)) as http:
        async def worker(s: Session) -> None:
            for t in range(shape.turns):
                await _turn(http, urls[s.n % len(urls)], s, half, half, last if t == shape.turns - 1 else figures)
        await asyncio.gather(*(worker(s) for s in sessions))
    figures.ttft_s += last.ttft_s
    figures.errors += last.errors


def _client(concurrency: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                 timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S))


def conversation_counts(sidecar: SidecarProc) -> dict[str, float]:
    text = sidecar.metrics_text()
    return {what: metric_sum(text, "loadaware_tokenizer_conversation_cache", {"what": what})
            for what in ("hits", "misses")}


def run_conversation(out_dir: Path, shape: ConversationShape) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    arms: dict[str, dict[str, Any]] = {}
    with gateway(out_dir / "logs-conversation", CONVERSATION_SIDECAR_ARGS, "/v1/chat/completions") as (sidecar, urls):
        assert sidecar.proc is not None
        pid = sidecar.proc.pid
        for a, arm in enumerate(ARMS):
            sessions = [Session(1_000_000 * (a + 1) + i) for i in range(shape.sessions)]
            way_in = ArmFigures(arm)
            asyncio.run(warm(urls[arm], sessions, shape, way_in))
            figures, last = ArmFigures(arm), ArmFigures(arm)
            cpu0, stages0, cache0 = cpu_seconds(pid), stage_sums(sidecar), conversation_counts(sidecar)
            started = time.monotonic()
            asyncio.run(measured_turns(urls[arm], sessions, shape, figures, last))
            n = shape.sessions * shape.turns
            if arm != "direct":
                figures.sidecar_cpu_s = cpu_seconds(pid) - cpu0
                figures.stage_s = {k: v - stages0[k] for k, v in stage_sums(sidecar).items()}
            summary = figures.summary(n)
            summary.update(wall_s=time.monotonic() - started, way_in_errors=way_in.errors,
                           last_turn_p99_s=percentile(sorted(last.ttft_s), 99) if last.ttft_s else None,
                           final_kb=max(s.chars for s in sessions) / 1024)
            if arm != "direct":
                summary["conversation_cache"] = {k: v - cache0[k] for k, v in conversation_counts(sidecar).items()}
            arms[arm] = summary
            log.info("conversation, %s: %s", arm, json.dumps(summary))
    _added(arms)
    return {"shape": shape.__dict__, "arms": arms}


def _added(arms: dict[str, dict[str, Any]]) -> None:
    direct = arms["direct"]
    for arm, a in arms.items():
        if arm == "direct":
            continue
        for q in ("p50", "p99"):
            mine, base = a[f"ttft_{q}_s"], direct[f"ttft_{q}_s"]
            a[f"added_{q}_s"] = mine - base if mine is not None and base is not None else None


def long_context_tokenizer(out_dir: Path) -> Path:
    """The tiny tokenizer with room for long documents (model_max_length 1 Mi tokens), for the simulated engines."""
    folder = out_dir / "tiny-model-long-context"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(TINY_TOKENIZER / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((TINY_TOKENIZER / "tokenizer_config.json").read_text())
    config["model_max_length"] = 1 << 20
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def run_new_user(out_dir: Path, documents: int = 8, doc_kb: int = 220, concurrency: int = 150,
                 requests: int = 300) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = long_context_tokenizer(out_dir)

    def engines(log_dir: Path) -> ManagedProc:
        return FleetProc(log_dir, engines=3, tokenizer=tokenizer, extra_args=FAST_FLEET)

    docs = [prompt_of(doc_kb * 1024, 50_000_000 + d) for d in range(documents)]
    bodies = [json.dumps({"model": "tiny-model", "max_tokens": 8, "stream": True,
                          "prompt": f"{docs[i % documents]}\n\nQuestion {i}: what does the document say about "
                                    f"{WORDS[i % len(WORDS)]}?"}).encode() for i in range(requests)]
    arms: dict[str, dict[str, Any]] = {}
    with gateway(out_dir / "logs-new-user", (), "/v1/completions", engines) as (sidecar, urls):
        assert sidecar.proc is not None
        pid = sidecar.proc.pid
        for arm in ("direct", "buffered"):
            figures = ArmFigures(arm)
            cpu0, stages0 = cpu_seconds(pid), stage_sums(sidecar)
            started = time.monotonic()
            asyncio.run(_closed_loop(urls[arm], bodies, concurrency, figures))
            if arm != "direct":
                figures.sidecar_cpu_s = cpu_seconds(pid) - cpu0
                figures.stage_s = {k: v - stages0[k] for k, v in stage_sums(sidecar).items()}
            arms[arm] = {**figures.summary(requests), "wall_s": time.monotonic() - started}
            log.info("new user, %s: %s", arm, json.dumps(arms[arm]))
    _added(arms)
    d, b = arms["direct"]["ttft_p99_s"], arms["buffered"]["ttft_p99_s"]
    arms["buffered"]["added_p99_pct"] = (b / d - 1) * 100 if d and b else None
    return {"documents": documents, "doc_kb": doc_kb, "concurrency": concurrency, "requests": requests,
            "arms": arms}


async def _closed_loop(urls: list[str], bodies: list[bytes], concurrency: int, figures: ArmFigures) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(bodies)):
        queue.put_nowait(i)
    async with _client(concurrency) as http:
        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                await one(http, urls[i % len(urls)], bodies[i], figures)
        await asyncio.gather(*(worker() for _ in range(concurrency)))


def tables(result: dict[str, Any]) -> str:
    lines: list[str] = []
    conv = result.get("conversation")
    if conv:
        shape = conv["shape"]
        lines += [f"### Conversation case: {shape['sessions']} sessions at once growing to {shape['final_kb']} KB "
                  f"({shape['turns']} measured turns of {shape['turn_kb']} KB each; null engines)", "",
                  "| arm | TTFT p50 / p99 | added p50 / p99 | last turn p99 | sidecar CPU per request | stages "
                  "per request (parse, tokenize, lookup, score) | cache hits / misses | decided without tokens "
                  "(busy / timeout) | errors |", "|---|---|---|---|---|---|---|---|---|"]
        for arm, a in conv["arms"].items():
            lines.append(_conversation_row(arm, a))
        lines.append("")
    new = result.get("new_user")
    if new:
        d, b = new["arms"]["direct"], new["arms"]["buffered"]
        lines += [f"### New-user case: {new['documents']} shared {new['doc_kb']} KB documents, concurrency "
                  f"{new['concurrency']}, {new['requests']} requests (3 fast simulated engines)", "",
                  "| direct p50 / p99 | BUFFERED p50 / p99 | gateway adds to p99 | sidecar CPU per request | "
                  "decided without tokens (busy / timeout) | errors (direct / BUFFERED) |", "|---|---|---|---|---|---|",
                  f"| {_s(d['ttft_p50_s'])} / {_s(d['ttft_p99_s'])} | {_s(b['ttft_p50_s'])} / {_s(b['ttft_p99_s'])} | "
                  f"{_pct(b.get('added_p99_pct'))} | {b['sidecar_cpu_ms_per_request']:.1f} ms | "
                  f"{_untokenized(b)} | {d['errors']} / {b['errors']} |", ""]
    return "\n".join(lines)


def _conversation_row(arm: str, a: dict[str, Any]) -> str:
    stages = ", ".join(f"{a['stage_ms_per_request'].get(s, 0):.2f}" for s in ("parse", "tokenize", "lookup",
                                                                                "score"))
    cache = a.get("conversation_cache")
    hits = "-" if not cache else f"{cache['hits']:.0f} / {cache['misses']:.0f}"
    return (f"| {arm} | {_ms(a['ttft_p50_s'])} / {_ms(a['ttft_p99_s'])} | {_ms(a.get('added_p50_s'))} / "
            f"{_ms(a.get('added_p99_s'))} | {_ms(a.get('last_turn_p99_s'))} | "
            f"{a['sidecar_cpu_ms_per_request']:.2f} ms | {stages if arm != 'direct' else '-'} | "
            f"{hits} | "
            f"{_untokenized(a) if arm != 'direct' else '-'} | {a['errors']} (way in {a['way_in_errors']}) |")


def _untokenized(arm: dict[str, Any]) -> str:
    counts = arm.get("untokenized", {})
    return " / ".join(str(counts.get(r, 0)) for r in ("tokenizer_busy", "tokenizer_timeout"))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f} ms"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0f}%"
