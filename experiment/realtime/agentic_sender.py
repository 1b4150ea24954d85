"""The agentic workload's client in real time (experiment.agentic): closed-loop sessions through the stack.

Each turn is sent `pause_s` after the turns it waits for have ended (root sessions' first turns at their start
times). A chat turn re-sends the whole conversation: the system prompt, each input, and each reply as the engine
actually streamed it. A Responses turn sends the instructions and, for a follow-up, `previous_response_id` (the
id the previous turn's stream announced in `response.created`) and its new input only; if that answers 404
(the request reached an engine that does not hold the response) the miss is counted and the turn is re-sent
with the whole history as input items and no `previous_response_id` (stored again). A turn's TTFT runs from its
first send to the first text delta of its successful attempt; every turn's record is kept.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from experiment.agentic import AgenticSpec, Segment, Turn, build
from experiment.records import RequestRecord

SERVED_BY = "x-served-by"
MODEL = "tiny-model"
clock = time.perf_counter


@dataclass
class TurnState:
    done: asyncio.Event = field(default_factory=asyncio.Event)
    reply: str = ""  # the text the engine streamed
    response_id: str | None = None
    status: int = 0  # the first attempt's HTTP status


def _messages(turn: Turn, replies: dict[int, str], session_turns: Sequence[Turn]) -> list[dict[str, str]]:
    """The whole conversation as chat messages, each earlier reply as the engine streamed it."""
    out: list[dict[str, str]] = []
    earlier = [t for t in session_turns if t.turn < turn.turn]
    out.append({"role": "system", "content": turn.system.text()})
    for t in earlier:
        out += [{"role": s.role, "content": s.text()} for s in t.new_input]
        out.append({"role": "assistant", "content": replies.get(t.index, t.output.text())})
    out += [{"role": s.role, "content": s.text()} for s in turn.new_input]
    return out


def _items(segments: Sequence[Segment] | Sequence[dict[str, str]]) -> list[dict[str, Any]]:
    return [{"type": "message", "role": s["role"], "content": s["content"]} if isinstance(s, dict)
            else {"type": "message", "role": s.role, "content": s.text()} for s in segments]


def body_of(turn: Turn, replies: dict[int, str], session_turns: Sequence[Turn], previous_id: str | None
            ) -> tuple[str, dict[str, Any]]:
    """(path, body) of one attempt: a Responses follow-up with `previous_id`, else the whole conversation."""
    if turn.api == "chat":
        return "/v1/chat/completions", {"model": MODEL, "messages": _messages(turn, replies, session_turns),
                                        "max_tokens": turn.max_tokens, "stream": True, "ignore_eos": True,
                                        "temperature": 0.0}
    common: dict[str, Any] = {"model": MODEL, "instructions": turn.system.text(), "stream": True,
                              "store": True, "max_output_tokens": turn.max_tokens, "temperature": 0.0}
    if previous_id is not None:
        return "/v1/responses", {**common, "previous_response_id": previous_id,
                                 "input": _items(turn.new_input)}
    history = _messages(turn, replies, session_turns)[1:]  # the system prompt travels as `instructions`
    return "/v1/responses", {**common, "input": _items(history)}


class AgenticClient:
    def __init__(self, url: str, session: aiohttp.ClientSession, spec: AgenticSpec, seed: int) -> None:
        self.url = url
        self.session = session
        self.workload = build(spec, seed)
        self.state = [TurnState() for _ in self.workload.turns]
        self.by_session: dict[int, list[Turn]] = {}
        for t in self.workload.turns:
            self.by_session.setdefault(t.session, []).append(t)
        self.records = [RequestRecord(t.index, 0.0, prompt_tokens=t.prompt_tokens, prefix=t.session)
                        for t in self.workload.turns]
        self.follow_ups = self.follow_ups_ok = self.retries = 0
        self.statuses: dict[str, int] = {}

    async def _attempt(self, turn: Turn, rec: RequestRecord, previous_id: str | None) -> int:
        """One POST; fills `rec` on success. Returns the HTTP status (0: a transport failure)."""
        replies = {t.index: self.state[t.index].reply for t in self.by_session[turn.session]}
        path, body = body_of(turn, replies, self.by_session[turn.session], previous_id)
        st = self.state[turn.index]
        try:
            async with self.session.post(self.url + path, data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"}) as resp:
                rec.engine = resp.headers.get(SERVED_BY)
                if resp.status != 200:
                    await resp.read()
                    return resp.status
                await self._read_stream(resp, turn, rec, st)
                return 200
        except (TimeoutError, aiohttp.ClientError) as e:
            rec.error = f"client_{type(e).__name__}"
            return 0

    async def _read_stream(self, resp: aiohttp.ClientResponse, turn: Turn, rec: RequestRecord, st: TurnState
                           ) -> None:
        pieces: list[str] = []
        last = 0.0
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            piece = _piece(event, turn.api)
            if event.get("type") == "response.created":
                st.response_id = event["response"]["id"]
            if piece is None:
                continue
            now = clock()
            if rec.first_token_t is None:
                rec.first_token_t = now
            else:
                rec.itl.append(now - last)
            last = now
            pieces.append(piece)
        rec.end_t = clock()
        rec.output_tokens = len(pieces)
        st.reply = "".join(pieces)
        rec.ok = rec.first_token_t is not None
        rec.error = None if rec.ok else "no_tokens"

    async def turn(self, turn: Turn, t0: float) -> None:
        for d in turn.after:
            await self.state[d].done.wait()
        await asyncio.sleep(turn.pause_s if turn.after else max(0.0, t0 + turn.start_s - clock()))
        rec, st = self.records[turn.index], self.state[turn.index]
        rec.send_t = clock()
        previous = self.state[turn.previous].response_id if turn.stateful and turn.previous is not None else None
        try:
            status = await self._attempt(turn, rec, previous)
            if turn.stateful:
                self.follow_ups += 1
                self.follow_ups_ok += status == 200
                self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
                if status == 404:  # not on the holder: re-send with the whole history
                    self.retries += 1
                    status = await self._attempt(turn, rec, None)
            if status != 200:
                rec.error = rec.error or f"http_{status}"
                rec.end_t = clock()
            st.status = status
        finally:
            st.done.set()

    async def run(self, deadline_s: float) -> None:
        t0 = clock() + 0.05
        tasks = [asyncio.create_task(self.turn(t, t0)) for t in self.workload.turns]
        _, pending = await asyncio.wait(tasks, timeout=deadline_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for rec in self.records:
            if not rec.ok and rec.end_t is None:
                rec.error = rec.error or "drain_timeout"
                rec.end_t = clock()

    def extra(self) -> dict[str, Any]:
        return {"turns": len(self.records), "follow_ups": self.follow_ups, "follow_ups_200": self.follow_ups_ok,
                "retries_after_404": self.retries, "follow_up_statuses": self.statuses}


def _piece(event: dict[str, Any], api: str) -> str | None:
    """The text a stream event carries (None: not a token event)."""
    if api == "responses":
        return str(event.get("delta", "")) if event.get("type") == "response.output_text.delta" else None
    choices = event.get("choices") or []
    if not choices:
        return None
    content = (choices[0].get("delta") or {}).get("content")
    return content if isinstance(content, str) and content else None
