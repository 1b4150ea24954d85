"""Stage 2, the data producers: what the selected policy reads of the request, each time-boxed and optional.

    tokens   the prompt's token ids as the engine will see them   (only for a policy with Needs.prefix)
    prefix   endpoint -> prompt tokens it holds                   (the prefix source, when tokens came)
    state    the engine holding the stored response the request names (fleet/state_holders.py)

A producer that fails leaves its field empty and names itself in the reasons (no_tokenizer, tokenizer_busy,
tokenizer_timeout, tokenizer_error, no_prefix_source, the source's own reason, prefix_error, state_error): the
decision goes on with the load term.
"""

from __future__ import annotations

import time
from typing import Protocol

from loadaware.fleet.registry import EndpointRegistry
from loadaware.prefix.source import PartlyUnavailable, PrefixSource, PrefixUnavailable, PromptTokens
from loadaware.routing.context import DecisionContext, degraded
from loadaware.routing.request import InferenceRequest
from loadaware.tokenize.tokenizer import TokenHead, TokenizerBusy


class PromptEncoder(Protocol):
    async def encode_prompt(self, prompt: str) -> list[int]: ...

    async def encode_chat(self, messages: list[dict[str, object]], options: dict[str, object] | None = None
                          ) -> list[int]: ...


class StateLocator(Protocol):
    async def locate(self, response_id: str, fleet: tuple[str, ...]) -> tuple[str | None, str]: ...

    def learn(self, response_id: str, endpoint: str) -> None: ...


class Producers:
    def __init__(self, registry: EndpointRegistry, tokenizer: PromptEncoder | None = None,
                 prefix_source: PrefixSource | None = None, state: StateLocator | None = None) -> None:
        self.registry = registry
        self.tokenizer = tokenizer
        self.prefix_source = prefix_source
        # Where stored responses live (fleet/state_holders.py): a request naming one goes to its holder, whatever
        # the policy would say (state beats load). None: no state routing.
        self.state = state

    async def produce(self, ctx: DecisionContext, prefix: bool) -> None:
        """Tokens and prefix matches for a policy that reads them (`prefix`), then the state holder."""
        request = ctx.request
        if request is not None and request.state_id is not None and not request.has_prompt:
            pass  # a stored response's own path: placed by its state, there is no prompt to miss
        elif request is None or not request.has_prompt:
            ctx.reasons.append(request.unscored or "no_prompt" if request is not None else "no_prompt")
        elif prefix:
            await self.tokens(ctx, request)
            if ctx.tokens:
                await self.prefix(ctx, request)
        if request is not None and request.state_id is not None:
            await self.holder(ctx, request.state_id)

    async def prompt_tokens(self, request: InferenceRequest) -> list[int]:
        """Token ids as the engine will see them; raises on tokenizer failure or timeout."""
        if request.messages is not None:
            if self.tokenizer is None:
                raise LookupError("no_tokenizer")
            return await self.tokenizer.encode_chat(request.messages, request.chat_options)
        if isinstance(request.prompt, list):
            return request.prompt
        if self.tokenizer is None:
            raise LookupError("no_tokenizer")
        return await self.tokenizer.encode_prompt(request.prompt or "")

    async def tokens(self, ctx: DecisionContext, request: InferenceRequest) -> None:
        t = time.perf_counter()
        tokens: list[int] = []
        try:
            tokens = await self.prompt_tokens(request)
        except LookupError as exc:  # no tokenizer, or no chat template that renders (told once at start)
            ctx.reasons.append(str(exc.args[0]) if exc.args else "no_tokenizer")
        except TokenizerBusy:  # the threads' backlog would not start it in time: not waited for
            ctx.reasons.append("tokenizer_busy")
        except TimeoutError:
            ctx.reasons.append("tokenizer_timeout")
        except Exception as exc:  # noqa: BLE001 - any tokenizer failure degrades, never fails, the request
            ctx.degrade("tokenizer_error", exc)
        ctx.timed("tokenize", t)
        if isinstance(tokens, TokenHead):  # a long prompt: its head's ids, its whole length estimated
            ctx.prompt_total = tokens.total
        if tokens:
            # The salt keys the engine's prefix cache as much as the tokens do; it travels with them (the
            # approximate index records the decision's tokens under it), as do the block-key chains the
            # decision's lookups compute once and share, until the decision is announced.
            tokens = PromptTokens(tokens, request.cache_salt or None)
        ctx.tokens = tokens

    async def prefix(self, ctx: DecisionContext, request: InferenceRequest) -> None:
        t = time.perf_counter()
        ctx.matches = await self.matches(ctx.tokens, ctx.endpoints, ctx.reasons, request.cache_salt)
        ctx.timed("lookup", t)

    async def matches(self, tokens: list[int], endpoints: tuple[str, ...], reasons: list[str],
                      salt: str | None = None) -> dict[str, int]:
        if self.prefix_source is None:
            reasons.append("no_prefix_source")
            return {}
        try:
            return await self.prefix_source.matches(tokens, endpoints, salt)
        except PrefixUnavailable as exc:
            reasons.append(exc.reason)
            # A combined source that lost one member still has the others' answer (prefix/combined.py).
            return exc.answer if isinstance(exc, PartlyUnavailable) else {}
        except Exception as exc:  # noqa: BLE001 - a broken source degrades to the load term, never fails
            degraded(reasons, "prefix_error", exc)
            return {}

    async def holder(self, ctx: DecisionContext, response_id: str) -> None:
        """The engine holding a stored response, and how it was found (fleet/state_holders.py)."""
        if self.state is None:
            ctx.state = "no_locator"
            return
        t = time.perf_counter()
        try:
            ctx.holder, ctx.state = await self.state.locate(response_id, self.registry.snapshot())
        except Exception as exc:  # noqa: BLE001 - a failing locator: routed as any request, the engine answers
            ctx.degrade("state_error", exc)
            ctx.holder, ctx.state = None, "error"
        finally:
            ctx.timed("state", t)
