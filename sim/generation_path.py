"""What the Responses and Messages handlers share with the chat completions path of `sim/engine.py`.

Every request renders chat messages with the sim's own chat template (`SimTokenizer.render_chat`) and runs
through `EngineCore.generate`, the one engine path: queueing for a slot, the prefix cache and its KV events,
LMCache reporting, metrics and timing count exactly as for a chat completion. The test hooks behave as on
the chat path: `x-sim-fail: <status>`, `x-sim-abort-after: N` (streamed events), `x-sim-body-sha256` and
`x-sim-traceparent` on every answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import jinja2
from aiohttp import web

from sim.engine_core import EngineCore
from sim.responses_format import ApiError, invalid, trim_to_final_message
from sim.tokenization import PromptError, SimTokenizer

_INLINE_CHARS = 16_384  # larger prompts render and encode off the event loop (as sim/tokenization.py)


@dataclass(frozen=True)
class EngineView:
    """The parts of an Engine the API handlers use (no import of sim.engine: it imports them)."""

    core: EngineCore
    tokenizer: SimTokenizer
    model_id: str
    servable: frozenset[str]
    served_by: dict[str, str]


@dataclass
class Generated:
    text: str
    output_tokens: int
    cached_tokens: int  # vLLM's num_cached_tokens: prompt tokens served from the GPU prefix cache or LMCache


class StreamEvents(Protocol):
    def opening(self) -> list[bytes]: ...

    def token(self, piece: str) -> list[bytes]: ...

    def closing(self, output_tokens: int, cached_tokens: int) -> list[bytes]: ...


class _Abort(Exception):
    """x-sim-abort-after was reached."""


class GenerationPath:
    def __init__(self, view: EngineView) -> None:
        self.view = view
        self.core = view.core
        self.tokenizer = view.tokenizer

    # ---- request ---------------------------------------------------------------------------------------
    def injected_failure(self, request: web.BaseRequest) -> int | None:
        fail = request.headers.get("x-sim-fail")
        if fail is None:
            return None
        self.core.stats.failed += 1
        return int(fail) if fail.isdigit() and 400 <= int(fail) <= 599 else 500

    async def read(self, request: web.BaseRequest) -> tuple[dict[str, Any], dict[str, str]]:
        """The JSON object body and the hook headers every answer carries."""
        raw = await request.read()
        received = {"x-sim-body-sha256": hashlib.sha256(raw).hexdigest()}
        if "traceparent" in request.headers:
            received["x-sim-traceparent"] = request.headers["traceparent"]
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise invalid("body is not valid JSON", None) from None
        if not isinstance(body, dict):
            raise invalid("body must be a JSON object", None)
        return body, received

    def check_model(self, model: Any) -> None:
        if model is not None and model not in self.view.servable:  # any served name or loaded adapter, as vLLM
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")

    async def encode(self, messages: list[dict[str, Any]], continue_final: bool = False) -> list[int]:
        size = sum(len(str(m.get("content", ""))) for m in messages)
        if size <= _INLINE_CHARS:
            return self._encode(messages, continue_final)
        return await asyncio.to_thread(self._encode, messages, continue_final)

    def _encode(self, messages: list[dict[str, Any]], continue_final: bool) -> list[int]:
        try:
            text = self.tokenizer.render_chat(messages, add_generation_prompt=not continue_final)
        except (PromptError, jinja2.TemplateError, TypeError) as e:
            raise ApiError(400, str(e)) from None
        if continue_final:
            text = trim_to_final_message(text, messages)
        return self.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids

    # ---- answers ---------------------------------------------------------------------------------------
    def json(self, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(text=json.dumps(body), status=status, content_type="application/json",
                            headers={**self.view.served_by, **(headers or {})})

    async def collect(self, prompt: list[int], max_tokens: int) -> Generated:
        admitted: list[int] = []
        pieces: list[str] = []
        async with contextlib.aclosing(self.core.generate(prompt, max_tokens, on_admit=admitted.append)) as gen:
            async for piece in gen:
                pieces.append(piece)
        return Generated("".join(pieces), len(pieces), admitted[0] if admitted else 0)

    async def stream(self, request: web.BaseRequest, headers: dict[str, str], prompt: list[int], max_tokens: int,
                     events: StreamEvents) -> web.StreamResponse:
        resp = web.StreamResponse(headers={**self.view.served_by, **headers, "Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        send = _sender(resp, request.headers.get("x-sim-abort-after"))
        admitted: list[int] = []
        produced = 0
        try:
            await send(events.opening())
            async with contextlib.aclosing(self.core.generate(prompt, max_tokens,
                                                              on_admit=admitted.append)) as gen:
                async for piece in gen:
                    produced += 1
                    await send(events.token(piece))
            await send(events.closing(produced, admitted[0] if admitted else 0))
            await resp.write_eof()
        except _Abort:
            # Drop the TCP connection mid-body: the client sees a truncated chunked stream, like an engine crash.
            if request.transport is not None:
                request.transport.abort()
        except (ConnectionResetError, ConnectionError):
            pass  # the client went away; generate() was closed and freed its slot
        return resp


def _sender(resp: web.StreamResponse, abort_after: str | None) -> Callable[[list[bytes]], Awaitable[None]]:
    limit = int(abort_after) if abort_after and abort_after.isdigit() else None
    sent = 0

    async def send(chunks: list[bytes]) -> None:
        nonlocal sent
        for chunk in chunks:
            if limit is not None and sent >= limit:
                raise _Abort
            await resp.write(chunk)
            sent += 1

    return send
