"""One simulated vLLM engine served over HTTP (OpenAI API, /tokenize, /metrics, test hooks).

Also vLLM's agentic APIs on the same engine path: the OpenAI Responses API (POST /v1/responses, GET
/v1/responses/{id}, POST /v1/responses/{id}/cancel; sim/responses_api.py) and the Anthropic Messages API
(POST /v1/messages; sim/messages_api.py).

Built on aiohttp's low-level `web.Server` with a dict dispatch: no router or middleware per request, as
many engines share one event loop. `handler_cancellation=True` makes a client disconnect cancel the
handler, which unwinds the generation and frees its running slot (vLLM aborts such requests too).

Test hooks: header `x-sim-fail: <status>` answers that status with an OpenAI-style error; header
`x-sim-abort-after: N` drops the connection after N streamed events; every completion's response carries
`x-sim-body-sha256`, the SHA-256 (hex) of the request body exactly as the engine received it, and
`x-sim-traceparent`, the request's `traceparent` when it had one; POST
/sim/phantom_load adds phantom running / waiting counts to the gauges; GET /sim/state; POST /sim/reset_cache;
POST /sim/fault {"mode": "error" | "hang" | "none", "status": 500} breaks (and heals) the whole engine;
POST /sim/kv_drop {"batches": n} loses the next n KV-event batches on the wire (a gap; with --kv-events).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from loadaware.fleet.addresses import format_hostport
from sim.engine_core import EngineCore, filler_texts
from sim.generation_path import EngineView
from sim.lmcache_reporter import ControllerAddress, LMCacheReporter
from sim.messages_api import MessagesApi
from sim.models import EngineModels
from sim.openai_format import StreamFormatter, error_body, full_response, new_request_id
from sim.response_store import ResponseStore, store_enabled
from sim.responses_api import ResponsesApi
from sim.service_model import ServiceModel
from sim.tokenization import PromptError, SimTokenizer

log = logging.getLogger(__name__)

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
DEFAULT_MAX_TOKENS = 16


@dataclass
class EngineConfig:
    name: str
    ip: str = "127.0.0.2"
    port: int = 8000  # 0 picks a free port
    model_id: str = "tiny-model"
    models: EngineModels | None = None  # served names and LoRA adapters (None: model_id alone)
    service: ServiceModel = field(default_factory=ServiceModel)
    lmcache: ControllerAddress | None = None
    lmcache_worker_port: int = 0  # where the controller's REQ socket connects back; 0 picks a free port
    # The Responses API store (vLLM: VLLM_ENABLE_RESPONSES_API_STORE=1); None: that env var when set, else on.
    responses_store: bool | None = None


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


class Engine:
    def __init__(self, config: EngineConfig, tokenizer: SimTokenizer) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.models = config.models or EngineModels((config.model_id,))
        self._servable = self.models.servable()
        reporter = None
        if config.lmcache is not None:
            reporter = LMCacheReporter(config.lmcache, config.name, config.ip, config.lmcache_worker_port,
                                       current_keys=lambda: self.core.lmcache.keys())
        self.reporter = reporter
        filler = filler_texts(tokenizer.decode_one,
                              lambda s: tokenizer.tokenizer.encode(s, add_special_tokens=False).ids)
        self.core = EngineCore(config.name, config.model_id, config.service, filler, reporter)
        self.port = config.port
        self._runner: web.ServerRunner | None = None
        self._served_by = {"x-served-by": config.name}
        view = EngineView(self.core, tokenizer, config.model_id, self._servable, self._served_by)
        self.responses = ResponsesApi(view, ResponseStore(store_enabled(config.responses_store)))
        self.messages = MessagesApi(view)
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/completions"): lambda r: self._completions(r, chat=False),
            ("POST", "/v1/chat/completions"): lambda r: self._completions(r, chat=True),
            ("POST", "/v1/responses"): self.responses.create,  # and /v1/responses/{id}[/cancel]: _dispatch
            ("POST", "/v1/messages"): self.messages.create,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("POST", "/tokenize"): self._tokenize,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/sim/state"): self._state,
            ("POST", "/sim/phantom_load"): self._phantom_load,
            ("POST", "/sim/reset_cache"): self._reset_cache,
            ("POST", "/sim/fault"): self._set_fault,
            ("POST", "/sim/kv_drop"): self._kv_drop,
        }
        self.kv_drop: Callable[[int], None] | None = None  # the KV-event publisher's drop_next, when it has one
        # Engine-wide fault (POST /sim/fault): "error" answers every OpenAI request with `fault_status` at
        # once (server alive, as after an engine-core crash); "hang" accepts and never answers anything but
        # /sim/* until healed (a wedged server). /sim/* always answers, so a test can heal the engine.
        self.fault = "none"
        self.fault_status = 500
        self._healed = asyncio.Event()
        self._healed.set()

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def ip(self) -> str:
        return self.config.ip

    @property
    def url(self) -> str:
        return f"http://{format_hostport(self.config.ip, self.port)}"

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "url": self.url, "ip": self.ip, "port": self.port}
        if self.reporter is not None:
            d["lmcache_instance_id"] = self.name
            d["lmcache_worker_port"] = self.reporter.worker_port
        d["models"] = sorted(self._servable)
        return d

    # ---- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        server = web.Server(self._dispatch, handler_cancellation=True, access_log=None)
        self._runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.ip, self.config.port, reuse_address=True)
        await site.start()
        if self.config.port == 0:
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if self.reporter is not None:
            await self.reporter.start()

    async def stop(self) -> None:
        if self.reporter is not None:
            await self.reporter.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- plumbing --------------------------------------------------------------------------------------
    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        handler = self._routes.get((request.method, request.path)) or self.responses.route(request.method,
                                                                                            request.path)
        if handler is None:
            return self._json(error_body(404, f"no route {request.method} {request.path}"), 404)
        if self.fault != "none" and not request.path.startswith("/sim/"):
            if self.fault == "hang":
                await self._healed.wait()
            elif request.path.startswith("/v1/") and request.method == "POST":
                self.core.stats.failed += 1
                return self._json(error_body(self.fault_status, f"engine fault {self.fault_status} in "
                                                                f"{self.name}"), self.fault_status)
        try:
            return await handler(request)
        except _BadRequest as e:
            return self._json(error_body(e.status, e.message, e.param), e.status)

    def _json(self, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(text=json.dumps(body), status=status, content_type="application/json",
                            headers={**self._served_by, **headers} if headers else self._served_by)

    @staticmethod
    async def _body(request: web.BaseRequest) -> dict[str, Any]:
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            raise _BadRequest(400, "body is not valid JSON") from None
        if not isinstance(body, dict):
            raise _BadRequest(400, "body must be a JSON object")
        return body

    async def _kv_drop(self, request: web.BaseRequest) -> web.StreamResponse:
        batches = (await self._body(request)).get("batches", 1)
        if self.kv_drop is None or not isinstance(batches, int) or batches < 1:
            raise _BadRequest(400, 'expected {"batches": n >= 1} on an engine publishing KV events')
        self.kv_drop(batches)
        return self._json({"dropping": batches})

    async def _set_fault(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await self._body(request)
        mode = body.get("mode", "none")
        status = body.get("status", 500)
        if mode not in ("none", "error", "hang") or not isinstance(status, int) or not 500 <= status <= 599:
            raise _BadRequest(400, 'expected {"mode": "none" | "error" | "hang", "status": 5xx}')
        self.fault, self.fault_status = mode, status
        if mode == "hang":
            self._healed.clear()
        else:
            self._healed.set()
        return self._json({"mode": mode, "status": status})

    # ---- OpenAI API ------------------------------------------------------------------------------------
    async def _completions(self, request: web.BaseRequest, chat: bool) -> web.StreamResponse:
        fail = request.headers.get("x-sim-fail")
        if fail is not None:
            self.core.stats.failed += 1
            status = int(fail) if fail.isdigit() and 400 <= int(fail) <= 599 else 500
            return self._json(error_body(status, f"injected failure {status} by {self.name}"), status)
        # Test hook: what arrived, byte for byte (aiohttp keeps the read body, so _body reads the same bytes).
        received = {"x-sim-body-sha256": hashlib.sha256(await request.read()).hexdigest()}
        if "traceparent" in request.headers:
            received["x-sim-traceparent"] = request.headers["traceparent"]
        body = await self._body(request)
        model = body.get("model")
        if model is not None and model not in self._servable:  # any served name or loaded adapter, as vLLM
            raise _BadRequest(404, f"The model `{model}` does not exist.", "model")
        try:
            prompt = await self.tokenizer.encode_request_async(body, chat)
        except PromptError as e:
            raise _BadRequest(400, str(e)) from None
        max_tokens = body.get("max_completion_tokens") if chat else None
        max_tokens = max_tokens if max_tokens is not None else body.get("max_tokens", DEFAULT_MAX_TOKENS)
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _BadRequest(400, "max_tokens must be a positive integer")
        if len(prompt) + max_tokens > self.tokenizer.max_model_len:
            raise _BadRequest(400, f"prompt ({len(prompt)}) + max_tokens exceeds max_model_len "
                                   f"{self.tokenizer.max_model_len}")
        # Filler output never emits EOS, so every request runs to max_tokens: `ignore_eos` is accepted and
        # is effectively always true (finish_reason "length"), which keeps service times deterministic.
        request_id = new_request_id(chat)
        if body.get("stream"):
            abort_after = request.headers.get("x-sim-abort-after")
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(request, chat, request_id, prompt, max_tokens,
                                      int(abort_after) if abort_after and abort_after.isdigit() else None,
                                      include_usage, received)
        pieces: list[str] = []
        async with contextlib.aclosing(self.core.generate(prompt, max_tokens)) as gen:
            async for piece in gen:
                pieces.append(piece)
        return self._json(full_response(chat, request_id, self.config.model_id, "".join(pieces), len(prompt),
                                        len(pieces)), headers=received)

    async def _stream(self, request: web.BaseRequest, chat: bool, request_id: str, prompt: list[int],
                      max_tokens: int, abort_after: int | None, include_usage: bool,
                      extra_headers: dict[str, str]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={**self._served_by, **extra_headers, "Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        fmt = StreamFormatter(chat, request_id, self.config.model_id)
        sent = 0

        async def send(event: bytes) -> None:
            nonlocal sent
            if abort_after is not None and sent >= abort_after:
                raise _Abort
            await resp.write(event)
            sent += 1

        produced = 0
        try:
            async with contextlib.aclosing(self.core.generate(prompt, max_tokens)) as gen:
                async for piece in gen:
                    if produced == 0 and chat:
                        await send(fmt.role())
                    produced += 1
                    await send(fmt.token(piece, "length" if produced == max_tokens else None))
            if include_usage:
                await send(fmt.usage(len(prompt), produced))
            await send(fmt.done())
            await resp.write_eof()
        except _Abort:
            # Drop the TCP connection mid-body: the client sees a truncated chunked stream, like an engine crash.
            if request.transport is not None:
                request.transport.abort()
        except (ConnectionResetError, ConnectionError):
            pass  # the client went away; generate() was closed and freed its slot
        return resp

    async def _models(self, request: web.BaseRequest) -> web.StreamResponse:
        return self._json(self.models.listing(self.tokenizer.max_model_len))

    async def _health(self, request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(status=200, headers=self._served_by)

    async def _tokenize(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await self._body(request)
        tok = self.tokenizer
        try:
            if "messages" in body:
                text = tok.render_chat(body["messages"], bool(body.get("add_generation_prompt", True)))
                tokens = tok.tokenizer.encode(text, add_special_tokens=bool(body.get("add_special_tokens", False))).ids
            elif "prompt" in body and isinstance(body["prompt"], str):
                tokens = tok.tokenizer.encode(body["prompt"],
                                              add_special_tokens=bool(body.get("add_special_tokens", True))).ids
            else:
                raise PromptError("need 'prompt' (string) or 'messages'")
        except PromptError as e:
            raise _BadRequest(400, str(e)) from None
        return self._json({"count": len(tokens), "max_model_len": tok.max_model_len, "tokens": tokens,
                           "token_strs": None})

    async def _metrics(self, request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(text=self.core.metrics.render(), content_type="text/plain", charset="utf-8",
                            headers={**self._served_by, "X-Content-Type-Options": "nosniff"})

    # ---- test hooks ------------------------------------------------------------------------------------
    async def _state(self, request: web.BaseRequest) -> web.StreamResponse:
        state = self.core.state()
        state.update(url=self.url, ip=self.ip, port=self.port)
        if self.reporter is not None:
            state.update(lmcache_seq_num=self.reporter.seq_num, lmcache_dropped_ops=self.reporter.dropped_ops)
        return self._json(state)

    async def _phantom_load(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await self._body(request)
        try:
            running, waiting = int(body.get("running", 0)), int(body.get("waiting", 0))
        except (TypeError, ValueError):
            raise _BadRequest(400, "running / waiting must be integers") from None
        if running < 0 or waiting < 0:
            raise _BadRequest(400, "running / waiting must be >= 0")
        self.core.phantom.running, self.core.phantom.waiting = running, waiting
        return self._json({"running": running, "waiting": waiting})

    async def _reset_cache(self, request: web.BaseRequest) -> web.StreamResponse:
        return self._json(self.core.reset_cache())


class _Abort(Exception):
    """Raised inside a stream when x-sim-abort-after is reached."""

