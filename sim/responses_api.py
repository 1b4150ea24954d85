"""`POST /v1/responses`, `GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel` on a simulated engine, as
vLLM 0.32 answers them (entrypoints/openai/responses/serving.py); formats in sim/responses_format.py.

Order of checks, as vLLM's `_create_responses`: the body's validation, the model, then `previous_response_id`
(404 when the store holds no such completed response: store disabled, unknown, evicted or still running),
then rendering, then the prompt's length. `max_output_tokens` unset: the sim's default of 16 (vLLM's is the
whole remaining context, which the sim's filler output would fill); either way capped at max_model_len.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sim.generation_path import EngineView, Generated, GenerationPath
from sim.response_store import ResponseStore
from sim.responses_format import (
    ApiError,
    ResponsesRequest,
    ResponsesStream,
    construct_input_messages,
    continues_final_message,
    not_found,
    now,
    output_message,
    parse_request,
    random_id,
    response_body,
    usage,
)

DEFAULT_MAX_TOKENS = 16  # the sim's default for every API (sim/engine.py)
PREFIX = "/v1/responses/"

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def _status(output_tokens: int, max_tokens: int) -> str:
    """vLLM: finish_reason "length" makes the response "incomplete" (incomplete_details max_output_tokens).
    The sim's filler never emits EOS, so every generation runs to its limit."""
    return "incomplete" if output_tokens >= max_tokens else "completed"


class ResponsesApi(GenerationPath):
    def __init__(self, view: EngineView, store: ResponseStore) -> None:
        super().__init__(view)
        self.store = store

    def route(self, method: str, path: str) -> Handler | None:
        """The handler of a path naming a response id, if it is one."""
        if not path.startswith(PREFIX):
            return None
        rest = path[len(PREFIX):]
        response_id, _, action = rest.partition("/")
        if not response_id:
            return None
        if method == "GET" and not action and "/" not in rest:
            return lambda r: self._answer(self._retrieve(r, response_id))
        if method == "POST" and action == "cancel":
            return lambda r: self._answer(self._cancel(response_id))
        return None

    async def create(self, request: web.BaseRequest) -> web.StreamResponse:
        failed = self.injected_failure(request)
        if failed is not None:
            err = ApiError(failed, f"injected failure {failed} by {self.core.name}", "InternalServerError"
                           if failed >= 500 else "BadRequestError")
            return self.json(err.body(), failed)
        return await self._answer(self._create(request))

    async def _answer(self, work: Awaitable[web.StreamResponse]) -> web.StreamResponse:
        try:
            return await work
        except ApiError as e:
            return self.json(e.body(), e.status)

    # ---- create ----------------------------------------------------------------------------------------
    async def _create(self, request: web.BaseRequest) -> web.StreamResponse:
        body, received = await self.read(request)
        req = parse_request(body)
        self.check_model(body.get("model"))
        prev = None
        if req.previous_response_id is not None:
            prev = self.store.response(req.previous_response_id)
            if prev is None:
                raise not_found(req.previous_response_id)
        messages = construct_input_messages(req.instructions, req.input,
                                            self.store.messages(prev["id"]) if prev else None,
                                            prev["output"] if prev else None)
        prompt = await self.encode(messages, continues_final_message(req.input))
        max_tokens = self._max_tokens(req, len(prompt))
        store = req.store and self.store.enabled  # vLLM silently ignores `store` when its store is off
        if store:
            self.store.put_messages(req.request_id, messages)
        created = now()
        if req.stream:
            events = _ResponseEvents(self, req, created, max_tokens, store, len(prompt))
            return await self.stream(request, received, prompt, max_tokens, events)
        gen = await self.collect(prompt, max_tokens)
        output = [output_message(f"msg_{random_id()}", gen.text)]
        final = self.final(req, created, max_tokens, output, len(prompt), gen)
        if store:
            self.store.put_response(req.request_id, final)
        return self.json(final, headers=received)

    def _max_tokens(self, req: ResponsesRequest, prompt_tokens: int) -> int:
        limit = self.tokenizer.max_model_len
        if prompt_tokens >= limit:
            raise ApiError(400, f"The engine prompt length {prompt_tokens} exceeds the max_model_len {limit}. "
                                "Please reduce prompt.", "invalid_request_error", "input")
        requested = req.max_output_tokens if req.max_output_tokens is not None else DEFAULT_MAX_TOKENS
        if requested < 1:
            raise ApiError(400, f"max_tokens must be at least 1, got {requested}.", param="max_tokens")
        return min(requested, limit - prompt_tokens)

    def final(self, req: ResponsesRequest, created: int, max_tokens: int, output: list[dict[str, Any]],
              prompt_tokens: int, gen: Generated) -> dict[str, Any]:
        return response_body(req, self.view.model_id, created, max_tokens, output,
                             _status(gen.output_tokens, max_tokens),
                             usage(prompt_tokens, gen.output_tokens, gen.cached_tokens))

    # ---- stored responses ------------------------------------------------------------------------------
    async def _retrieve(self, request: web.BaseRequest, response_id: str) -> web.StreamResponse:
        response = self.store.response(response_id)
        if response is None:
            raise not_found(response_id)
        if request.query.get("stream", "").lower() in ("1", "true"):
            # vLLM replays only a background response's events; for any other it fails with this message
            # (mid-stream there; a plain 400 here).
            raise ApiError(400, f"Unknown response_id: {response_id}", param="response_id")
        return self.json(response)

    async def _cancel(self, response_id: str) -> web.StreamResponse:
        response = self.store.response(response_id)
        if response is None:
            raise not_found(response_id)
        # Only a queued or running background response can be cancelled; the sim stores finished ones only.
        if response["status"] not in ("queued", "in_progress"):
            raise ApiError(400, "Cannot cancel a synchronous response.", "invalid_request_error", "response_id")
        return self.json(response)


class _ResponseEvents:
    """Adapts ResponsesStream to the generation path's stream, storing the final response when asked to."""

    def __init__(self, api: ResponsesApi, req: ResponsesRequest, created: int, max_tokens: int, store: bool,
                 prompt_tokens: int) -> None:
        self.api, self.req, self.created, self.max_tokens = api, req, created, max_tokens
        self.store, self.prompt_tokens = store, prompt_tokens
        initial = response_body(req, api.view.model_id, created, max_tokens, [], "in_progress", None)
        self.events = ResponsesStream(initial)

    def opening(self) -> list[bytes]:
        return self.events.opening()

    def token(self, piece: str) -> list[bytes]:
        opened = self.events.first_token() if not self.events.text else []
        return [*opened, self.events.delta(piece)]

    def closing(self, output_tokens: int, cached_tokens: int) -> list[bytes]:
        done = self.events.closing()
        output = [self.events.item()] if self.events.text else []
        gen = Generated("".join(self.events.text), output_tokens, cached_tokens)
        final = self.api.final(self.req, self.created, self.max_tokens, output, self.prompt_tokens, gen)
        if self.store:
            self.api.store.put_response(self.req.request_id, final)
        return [*done, self.events.completed(final)]
