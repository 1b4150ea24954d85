"""`POST /v1/messages` (Anthropic) on a simulated engine, as vLLM 0.32 answers it (entrypoints/anthropic):
the request becomes a chat completion request (sim/messages_format.py) run on the chat path's engine;
its answers and errors are translated to Anthropic's shapes.

Inline system messages are merged into the leading system prompt only when the engine's chat template
needs system-first ordering, detected as vLLM does (rendering [system, user, system, user] in a plain
sandbox, once, at start). The sim's ChatML template renders that, so inline system messages stay inline.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from sim.generation_path import EngineView, GenerationPath
from sim.messages_format import (
    MessagesStream,
    anthropic_error,
    check_request,
    detect_merge_inline_system,
    full_response,
    to_chat_messages,
)
from sim.responses_format import ApiError, random_id


class MessagesApi(GenerationPath):
    def __init__(self, view: EngineView) -> None:
        super().__init__(view)
        self.merge_inline_system = detect_merge_inline_system(view.tokenizer.chat_template)

    def _error(self, err: ApiError) -> web.Response:
        # vLLM's global request-validation handler answers before the Messages router translates anything.
        body: Any = err.body() if err.err_type == "Bad Request" else anthropic_error(err)
        return self.json(body, err.status)

    async def create(self, request: web.BaseRequest) -> web.StreamResponse:
        failed = self.injected_failure(request)
        if failed is not None:
            return self._error(ApiError(failed, f"injected failure {failed} by {self.core.name}",
                                        "InternalServerError" if failed >= 500 else "BadRequestError"))
        try:
            return await self._create(request)
        except ApiError as e:
            return self._error(e)

    async def _create(self, request: web.BaseRequest) -> web.StreamResponse:
        body, received = await self.read(request)
        check_request(body)
        self.check_model(body["model"])
        messages = to_chat_messages(body, self.merge_inline_system)
        if not messages:
            raise ApiError(400, "messages must be a non-empty list")
        prompt = await self.encode(messages)
        max_tokens = body["max_tokens"]
        limit = self.tokenizer.max_model_len
        if len(prompt) + max_tokens > limit:  # as the sim's chat path
            raise ApiError(400, f"prompt ({len(prompt)}) + max_tokens exceeds max_model_len {limit}")
        message_id = f"chatcmpl-{request.headers.get('X-Request-Id') or random_id()}"  # the chat completion's id
        model = self.view.model_id
        if body.get("stream"):
            return await self.stream(request, received, prompt, max_tokens,
                                     _MessageEvents(MessagesStream(message_id, model, len(prompt)), max_tokens))
        gen = await self.collect(prompt, max_tokens)
        finish = "length" if gen.output_tokens >= max_tokens else "stop"
        return self.json(full_response(message_id, model, gen.text, len(prompt), gen.output_tokens, finish),
                         headers=received)


class _MessageEvents:
    """vLLM emits message_start with the chat stream's first chunk, which comes with the first token."""

    def __init__(self, events: MessagesStream, max_tokens: int) -> None:
        self.events = events
        self.max_tokens = max_tokens
        self.produced = 0

    def opening(self) -> list[bytes]:
        return []

    def token(self, piece: str) -> list[bytes]:
        self.produced += 1
        start = [self.events.start()] if self.produced == 1 else []
        return [*start, *self.events.token(piece)]

    def closing(self, output_tokens: int, cached_tokens: int) -> list[bytes]:
        start = [self.events.start()] if self.produced == 0 else []
        finish = "length" if output_tokens >= self.max_tokens else "stop"
        return [*start, *self.events.finish(output_tokens, finish)]
