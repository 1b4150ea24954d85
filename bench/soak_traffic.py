"""The mixed soak's traffic (`python -m bench.soak`): an open-loop generator in its own process.

One arrival schedule (Poisson, `burst_factor` times the rate inside the burst windows), and for each arrival a
kind drawn by weight:

    completion     /v1/completions: one of 64 shared ~1,544-token prefixes, the request's own number and words;
                   a share of them carry a new session key (the sidecar's session map fills)
    chat           /v1/chat/completions: conversations of `chat_turns` turns, each turn the previous messages
                   plus one more (the tokenizer's chat template; the conversation cache fills), one session each
    long           /v1/completions with a prompt of `long_prompt_kb` KB that starts with the request's number
    responses      /v1/responses with store: a new response, or a follow-up naming a recent one
                   (previous_response_id: the sidecar must route it to the engine holding it)
    stream_cancel  a streamed completion the client closes after its first event (a cancel mid-response)

Every request names an objective (x-gateway-inference-objective) and a tenant (x-gateway-inference-fairness-id)
for admission. A seeded share of the clients hang up at a random moment early in their request.

What counts as failed: an answer that is not 2xx and not 429 with Retry-After (admission shedding a sheddable
request), or no answer (time-out, reset). A hang-up or a cancel the client made is not a failure. A follow-up
answered 404 is kept apart with its parent's engine and times: the caller excuses it when that engine had left
the fleet in between (the sidecar then cannot reach the holder; the engine answers its own 404).

    python -m bench.soak_traffic SPEC.json OUT.json
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from .workload import MODEL, PREFIX_TOKENS, PromptBuilder

SESSION_HEADER = "x-session-id"
OBJECTIVE_HEADER = "x-gateway-inference-objective"
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
KINDS = ("completion", "chat", "long", "responses", "stream_cancel")
FAILURES_KEPT = 100  # the first failures with their detail; the count covers all of them


@dataclass
class TrafficSpec:
    url: str  # http://HOST:PORT of the gateway
    rate: float
    duration_s: float
    seed: int = 1
    mix: dict[str, float] = field(default_factory=lambda: {
        "completion": 0.45, "chat": 0.25, "long": 0.03, "responses": 0.17, "stream_cancel": 0.10})
    session_share: float = 0.5  # completions carrying a session key of their own
    chat_turns: int = 3
    followup_share: float = 0.4  # responses requests naming a recent stored response
    # Follow-ups name one of the last this many stored responses: fewer than the sidecar's --state-max-entries,
    # so the holder is known (an older id would make the sidecar ask the engines, within 0.5 s, which a loaded
    # 2-core machine misses: the request is then routed as any other and answered 404 by a non-holder).
    followup_window: int = 256
    hangup_fraction: float = 0.05
    hangup_within_s: float = 0.15
    bursts: list[tuple[float, float]] = field(default_factory=list)  # (start s, end s) from the first arrival
    burst_factor: float = 3.0
    objectives: dict[str, float] = field(default_factory=lambda: {"critical": 0.2, "standard": 0.5, "batch": 0.3})
    tenants: int = 8
    long_prompt_kb: int = 40
    max_tokens: int = 4
    timeout_s: float = 60.0
    connections: int = 512
    progress_file: str = ""  # sessions started so far, rewritten every second (the session probes read it)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrafficSpec:
        data = dict(data)
        data["bursts"] = [tuple(b) for b in data.get("bursts", [])]
        return cls(**data)


@dataclass
class TrafficResult:
    scheduled: int = 0
    sent: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)  # "kind:outcome" -> n
    failed: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)  # the first FAILURES_KEPT
    failed_per_minute: dict[str, int] = field(default_factory=dict)  # minute of the run -> failures in it (all)
    followup_404: list[dict[str, Any]] = field(default_factory=list)  # excused or not by the caller
    hangups: int = 0
    cancels: int = 0
    shed: int = 0
    sessions: int = 0
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def arrival_offsets(spec: TrafficSpec) -> list[float]:
    """Poisson arrivals over [0, duration), `burst_factor` times as dense inside the burst windows."""
    rng = random.Random(spec.seed)
    out: list[float] = []
    t = 0.0
    while True:
        rate = spec.rate * (spec.burst_factor if any(a <= t < b for a, b in spec.bursts) else 1.0)
        t += rng.expovariate(rate)
        if t >= spec.duration_s:
            return out
        out.append(t)


class Bodies:
    """The texts requests are made of, built once (PromptBuilder: exact token counts under the tiny tokenizer)."""

    def __init__(self, spec: TrafficSpec) -> None:
        b = PromptBuilder()
        rng = random.Random(spec.seed + 11)
        self.heads = [b.text(rng, PREFIX_TOKENS, lead=f"Document {k} about") for k in range(64)]
        # Long system prompts: each conversation's token ids fill the conversation cache's bytes fast.
        self.systems = [b.text(rng, 1000, lead=f"You are assistant {k}.") for k in range(16)]
        self.tails = [b.text(rng, 30) for _ in range(64)]
        self.long = [b.text(rng, spec.long_prompt_kb * 1024 // 5) for _ in range(4)]  # ~5 characters a token
        self.turns = [b.text(rng, 40) for _ in range(32)]


class Traffic:
    """The generator's state: the bodies, the conversation and the stored responses in progress, the tallies."""

    def __init__(self, spec: TrafficSpec) -> None:
        self.spec = spec
        self.bodies = Bodies(spec)
        self.rng = random.Random(spec.seed * 31 + 7)
        self.result = TrafficResult()
        self.outcomes: Counter[str] = Counter()
        self.kinds, self.weights = zip(*((k, w) for k, w in spec.mix.items() if w > 0))
        self.objectives, self.shares = zip(*spec.objectives.items())
        self.conversation: tuple[int, str, int] | None = None  # (number, session key, next turn)
        self.conversations = 0
        self.stored: deque[tuple[str, str, float]] = deque(maxlen=spec.followup_window)  # (id, served by, created)
        self.t0 = 0.0

    def new_session(self) -> str:
        self.result.sessions += 1
        return f"s{self.result.sessions}"

    def request(self, i: int) -> tuple[str, str, dict[str, Any], dict[str, str]]:
        """(kind, path, body, headers) of request `i`, its kind drawn by weight."""
        kind = self.rng.choices(self.kinds, self.weights)[0]
        headers = {OBJECTIVE_HEADER: self.rng.choices(self.objectives, self.shares)[0],
                   FAIRNESS_HEADER: f"tenant-{self.rng.randrange(self.spec.tenants)}"}
        b, n = self.bodies, self.spec.max_tokens
        if kind == "chat":
            body, headers[SESSION_HEADER] = self.chat_turn()
            return kind, "/v1/chat/completions", body, headers
        if kind == "long":
            return kind, "/v1/completions", {"model": MODEL, "max_tokens": n, "ignore_eos": True,
                                             "prompt": f"Request {i}: {b.long[i % len(b.long)]}"}, headers
        if kind == "responses":
            return kind, "/v1/responses", self.responses_body(i), headers
        body = {"model": MODEL, "max_tokens": n, "ignore_eos": True,
                "prompt": f"{b.heads[i % 64]} request {i}{b.tails[(i * 7) % 64]}"}
        if kind == "stream_cancel":
            body.update(stream=True, max_tokens=16)  # ~0.4 s of tokens on the soak's engines: time to cancel
        elif self.rng.random() < self.spec.session_share:
            headers[SESSION_HEADER] = self.new_session()
        return kind, "/v1/completions", body, headers

    def chat_turn(self) -> tuple[dict[str, Any], str]:
        """The next turn of the conversation in progress (a new one after `chat_turns`)."""
        if self.conversation is None or self.conversation[2] >= self.spec.chat_turns:
            self.conversations += 1
            self.conversation = (self.conversations, self.new_session(), 0)
        number, session, turn = self.conversation
        self.conversation = (number, session, turn + 1)
        b = self.bodies
        messages = [{"role": "system", "content": b.systems[number % len(b.systems)]}]
        for t in range(turn + 1):
            messages.append({"role": "user", "content": f"Conversation {number} turn {t}:"
                                                        f"{b.turns[(number + t) % len(b.turns)]}"})
            if t < turn:
                messages.append({"role": "assistant", "content": f"Answer {t} to conversation {number}."})
        return {"model": MODEL, "max_tokens": self.spec.max_tokens, "messages": messages}, session

    def responses_body(self, i: int) -> dict[str, Any]:
        body: dict[str, Any] = {"model": MODEL, "store": True, "max_output_tokens": self.spec.max_tokens,
                                "input": f"Question {i}:{self.bodies.tails[i % 64]}"}
        if self.stored and self.rng.random() < self.spec.followup_share:
            parent = self.stored[self.rng.randrange(len(self.stored))]
            body["previous_response_id"] = parent[0]
            body["_parent"] = parent  # taken out before sending: for the 404 record
        return body

    def tally(self, kind: str, outcome: str, detail: str = "") -> None:
        self.outcomes[f"{kind}:{outcome}"] += 1
        r = self.result
        if outcome == "ok":
            return
        if outcome == "hangup":
            r.hangups += 1
        elif outcome == "cancelled":
            r.cancels += 1
        elif outcome == "shed":
            r.shed += 1
        elif outcome != "followup_404":
            r.failed += 1
            t_s = time.monotonic() - self.t0
            minute = str(int(t_s // 60))  # a str key: the result goes through JSON
            r.failed_per_minute[minute] = r.failed_per_minute.get(minute, 0) + 1
            if len(r.failures) < FAILURES_KEPT:
                r.failures.append({"t_s": round(t_s, 3), "kind": kind, "outcome": outcome, "detail": detail[:300]})

    async def one(self, session: aiohttp.ClientSession, i: int, hangup_s: float | None) -> None:
        kind, path, body, headers = self.request(i)
        parent = body.pop("_parent", None)
        self.result.sent += 1
        try:
            async with asyncio.timeout(hangup_s):
                outcome, detail = await self.exchange(session, kind, path, body, headers)
        except TimeoutError:
            outcome, detail = ("hangup", "") if hangup_s is not None else ("error:timeout", "")
        except aiohttp.ClientError as exc:
            outcome, detail = f"error:{type(exc).__name__}", str(exc)
        if outcome == "http:404" and parent is not None:
            outcome = "followup_404"
            answered_by, _, _ = detail.partition(" ")
            self.result.followup_404.append({"t_s": round(time.monotonic() - self.t0, 3), "parent_served_by":
                                             parent[1], "parent_t_s": round(parent[2] - self.t0, 3),
                                             "answered_by": answered_by})
        self.tally(kind, outcome, detail)

    async def exchange(self, session: aiohttp.ClientSession, kind: str, path: str, body: dict[str, Any],
                       headers: dict[str, str]) -> tuple[str, str]:
        """(outcome, detail) of one request: ok, shed, cancelled, or http:<status> with the body's head."""
        async with session.post(self.spec.url + path, json=body, headers=headers) as resp:
            if kind == "stream_cancel" and resp.status == 200:
                async for piece in resp.content.iter_any():
                    if b"data:" in piece:
                        resp.close()  # the client leaves mid-response
                        return "cancelled", ""
                return "error:stream_without_events", ""
            data = await resp.read()
            if 200 <= resp.status < 300:
                if kind == "responses":
                    self.stored.append((json.loads(data)["id"], resp.headers.get("x-served-by", ""),
                                        time.monotonic()))
                return "ok", ""
            if resp.status == 429:
                return ("shed", "") if resp.headers.get("retry-after") else ("429-no-retry-after", data[:300].decode())
            # The engine that answered first (the gateway's own answers name none): a 404 follow-up is told apart.
            answered_by = resp.headers.get("x-served-by", "-")
            return f"http:{resp.status}", f"{answered_by} {data[:300].decode(errors='replace')}"


def hangup_delays(spec: TrafficSpec, n: int) -> dict[int, float]:
    rng = random.Random(spec.seed * 7919 + 17)
    chosen = rng.sample(range(n), min(n, round(n * spec.hangup_fraction)))
    return {i: rng.uniform(0.0, spec.hangup_within_s) for i in chosen}


async def progress(traffic: Traffic, path: Path) -> None:
    while True:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"sessions": traffic.result.sessions,
                                   "t_s": round(time.monotonic() - traffic.t0, 3)}))
        tmp.replace(path)
        await asyncio.sleep(1.0)


async def run_traffic(spec: TrafficSpec) -> TrafficResult:
    traffic = Traffic(spec)
    offsets = arrival_offsets(spec)
    hangups = hangup_delays(spec, len(offsets))
    traffic.result.scheduled = len(offsets)
    connector = aiohttp.TCPConnector(limit=spec.connections, limit_per_host=spec.connections, ttl_dns_cache=None)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=spec.timeout_s)) as session:
        traffic.t0 = time.monotonic()
        reporter = asyncio.create_task(progress(traffic, Path(spec.progress_file))) if spec.progress_file else None
        start = loop.time()
        tasks = []
        for i, off in enumerate(offsets):
            delay = start + off - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(traffic.one(session, i, hangups.get(i))))
        if tasks:
            await asyncio.wait(tasks, timeout=spec.timeout_s + 5.0)
        for task in tasks:
            if not task.done():
                task.cancel()
                traffic.tally("any", "error:unfinished")
        if reporter is not None:
            reporter.cancel()
    traffic.result.outcomes = dict(sorted(traffic.outcomes.items()))
    traffic.result.wall_s = round(time.monotonic() - traffic.t0, 3)
    return traffic.result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m bench.soak_traffic SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = TrafficSpec.from_dict(json.loads(Path(args[0]).read_text()))
    try:
        import uvloop

        result = uvloop.run(run_traffic(spec))
    except ImportError:  # pragma: no cover
        result = asyncio.run(run_traffic(spec))
    Path(args[1]).write_text(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
