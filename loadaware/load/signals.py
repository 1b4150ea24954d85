"""Per-endpoint token-level signals the placement policies read, tracked from the request lifecycle.

    prefill_tokens(i)  = uncached prompt tokens routed to i whose first response chunk has not come back
    prefill_matched(i) = the matched (prefix-held) prompt tokens of those same requests
    uncached_tokens(i) = uncached prompt tokens of every request in flight on i (until it ends)
    decoding(i)        = own requests on i past their first response chunk
    ttft(i)            = observed time to first response chunk (EWMA), and the endpoint's learned TTFT model

"Uncached" = prompt tokens minus the tokens the prefix source said i holds, at the decision. A request's
prefill is retired when its first response chunk passes the sidecar (the response path: picker / full-duplex
mode). Without a response path (buffered mode never sees the body) it is retired at the end of the
request, so prefill_tokens over-counts there by the decode phase; decoding then stays 0.

Counts move with the request when a retry lands on another engine (served), and each request is retired
exactly once. An endpoint that leaves the fleet is forgotten (`drop`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loadaware.lifecycle import Decision
from loadaware.policies.ttft_model import TtftModel

TTFT_EWMA_ALPHA = 0.1


@dataclass(slots=True)
class EndpointSignals:
    prefill_tokens: int = 0
    prefill_matched_tokens: int = 0
    uncached_tokens: int = 0
    decoding: int = 0
    ttft_s: float | None = None  # EWMA of observed time to first chunk
    model: TtftModel = field(default_factory=TtftModel)


@dataclass(slots=True)
class _Ticket:
    """One request's share of its endpoint's counts (parked on Decision.signals)."""

    endpoint: str
    uncached: int
    ahead: int  # the endpoint's prefill_tokens at the decision plus the request's own uncached tokens
    load: float
    at: float
    matched: int = 0
    matched_ahead: int = 0  # the endpoint's prefill_matched_tokens at the decision plus the request's own matched
    prefilled: bool = False


class SignalTracker:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._by_endpoint: dict[str, EndpointSignals] = {}

    def get(self, endpoint: str) -> EndpointSignals | None:
        return self._by_endpoint.get(endpoint)

    def _of(self, endpoint: str) -> EndpointSignals:
        s = self._by_endpoint.get(endpoint)
        if s is None:
            s = self._by_endpoint[endpoint] = EndpointSignals()
        return s

    # ---- the request lifecycle ----
    def on_decided(self, decision: Decision) -> None:
        ep = decision.endpoint
        if ep is None:
            return
        matched, load = 0, 0.0
        for c in decision.candidates:
            if c.endpoint == ep:
                matched, load = c.matched_tokens, c.load
                break
        uncached = max(0, decision.prompt_tokens - matched)
        held = decision.prompt_tokens - uncached
        s = self._of(ep)
        ticket = _Ticket(ep, uncached, s.prefill_tokens + uncached, load, self.clock(), held,
                         s.prefill_matched_tokens + held)
        s.prefill_tokens += uncached
        s.prefill_matched_tokens += held
        s.uncached_tokens += uncached
        decision.signals = ticket

    def on_served(self, decision: Decision, previous: str | None) -> None:
        t = decision.signals
        if not isinstance(t, _Ticket) or decision.served is None or decision.served == t.endpoint:
            return
        self._retire(t)
        t.endpoint = decision.served
        s = self._of(t.endpoint)
        t.ahead = s.prefill_tokens + t.uncached
        t.matched_ahead = s.prefill_matched_tokens + t.matched
        s.uncached_tokens += t.uncached
        if t.prefilled:
            s.decoding += 1
        else:
            s.prefill_tokens += t.uncached
            s.prefill_matched_tokens += t.matched

    def on_first_chunk(self, decision: Decision) -> None:
        t = decision.signals
        if not isinstance(t, _Ticket) or t.prefilled:
            return
        t.prefilled = True
        s = self._of(t.endpoint)
        s.prefill_tokens = max(0, s.prefill_tokens - t.uncached)
        s.prefill_matched_tokens = max(0, s.prefill_matched_tokens - t.matched)
        s.decoding += 1
        ttft = self.clock() - t.at
        s.ttft_s = ttft if s.ttft_s is None else s.ttft_s + TTFT_EWMA_ALPHA * (ttft - s.ttft_s)
        s.model.observe(t.ahead, t.load, ttft, t.matched_ahead)

    def on_ended(self, decision: Decision) -> None:
        t = decision.signals
        if isinstance(t, _Ticket):
            self._retire(t)
            decision.signals = None

    def _retire(self, t: _Ticket) -> None:
        s = self._by_endpoint.get(t.endpoint)
        if s is None:
            return  # dropped meanwhile: nothing left to retire from
        s.uncached_tokens = max(0, s.uncached_tokens - t.uncached)
        if t.prefilled:
            s.decoding = max(0, s.decoding - 1)
        else:
            s.prefill_tokens = max(0, s.prefill_tokens - t.uncached)
            s.prefill_matched_tokens = max(0, s.prefill_matched_tokens - t.matched)

    # ---- the fleet ----
    def drop(self, endpoint: str) -> None:
        self._by_endpoint.pop(endpoint, None)
