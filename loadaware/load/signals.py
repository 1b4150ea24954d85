"""Per-endpoint token-level signals the placement policies read, tracked from the request lifecycle.

    prefill_tokens(i)  = uncached prompt tokens routed to i whose prefill is not done (seen or estimated)
    prefill_matched(i) = the matched (prefix-held) prompt tokens of those same requests
    uncached_tokens(i) = uncached prompt tokens of every request in flight on i (until it ends)
    decoding(i)        = own requests on i past their first token (seen or estimated)
    ttft(i)            = observed time to first response chunk (EWMA), and (when asked for: `ttft_model`) the
                         endpoint's learned TTFT model over every request, which no sidecar policy reads
    clock(i)           = the prefill clock (prefill_clock.py): when the prefill work routed to i is done, at
                         the speed i showed on requests decided while its clock was idle

"Uncached" = prompt tokens minus the tokens the prefix source said i holds, at the decision. A request's
prefill is retired when its first response chunk passes the sidecar (the response path: picker / full-duplex
mode). BUFFERED mode never sees a response body: there a request's prefill is retired one mean TTFT of its
engine after the decision, the mean learned from the engine's own TTFT histogram at each scrape
(prefill_estimate.py; `scraped` hears of them), or at its end if that comes first; until the engine's mean
is known, at the end. Once any first chunk has passed, the response path is there and estimates stop.

Cost on the hot path: a decision adds one small record (the request's share) and a clock read; the
estimate's queue is settled on the next read of the endpoint (`get`) or decision, so a request costs O(1)
amortized; a first chunk adds a rank-one update of the clock's TTFT model when decided idle (~2 us, no solve); later
response chunks cost nothing here. Counts move with the request when a retry lands on
another engine (served), and each request is retired exactly once. An endpoint that leaves the fleet is
forgotten (`drop`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loadaware.lifecycle import Decision
from loadaware.load.prefill_clock import PrefillClock
from loadaware.load.prefill_estimate import TtftFromCounters
from loadaware.load.tracker import EngineStats
from loadaware.policies.base import Candidate
from loadaware.policies.ttft_model import Prices, TtftModel

TTFT_EWMA_ALPHA = 0.1
# The price floor is re-taken from every endpoint's last read prices this often (between, it only falls): a
# price that rose stops holding the floor down within this long.
FLOOR_REFRESH_S = 30.0


@dataclass(slots=True, eq=False)
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
    estimated: bool = False  # prefilled by the BUFFERED-mode estimate, not by a first chunk seen
    ended: bool = False
    idle: bool = False  # decided on an idle prefill clock and no scraped admission queue: the idle model learns


@dataclass(slots=True)
class EndpointSignals:
    prefill_tokens: int = 0
    prefill_matched_tokens: int = 0
    uncached_tokens: int = 0
    decoding: int = 0
    ttft_s: float | None = None  # EWMA of observed time to first chunk
    model: TtftModel | None = None  # the TTFT model over every request: only when the tracker is asked for it
    counters: TtftFromCounters = field(default_factory=TtftFromCounters)  # the engine's own TTFT histogram
    prefill_clock: PrefillClock = field(default_factory=PrefillClock)  # in the tracker's time
    # Requests in decision order whose prefill the estimate has not retired yet (BUFFERED mode only; made
    # at the first, as an empty deque costs 760 B an endpoint).
    pending: deque[_Ticket] | None = None


class SignalTracker:
    def __init__(self, clock: Callable[[], float] = time.monotonic, ttft_model: bool = False) -> None:
        self.clock = clock
        # Learn each endpoint's TTFT model over every request (EndpointSignals.model): no sidecar policy reads it
        # (the research arm `predictive` does, in the simulator), so the response path does not pay for it.
        self.ttft_model = ttft_model
        self._by_endpoint: dict[str, EndpointSignals] = {}
        self.estimating = True  # until a first response chunk shows the response path is there
        # The learned prices a large pool's scan may bound (routing/pruning.py, floored_candidates): the endpoints
        # whose prefill clock learned since a scan last read it (a scan scores them, whatever their load), each
        # other learned endpoint's prices as last read, and their lowest, which every unread endpoint's are at
        # least (base, per token, per running).
        self._unread: set[str] = set()
        self._read: dict[str, Prices] = {}
        self._floor: Prices | None = None
        self._floor_at = 0.0

    def peek(self, endpoint: str) -> EndpointSignals | None:
        """The endpoint's signals as last settled, changing nothing: for readers off the event loop (the
        /metrics page renders in a worker thread), which must not settle the estimate's queue while a decision
        on the loop does."""
        return self._by_endpoint.get(endpoint)

    def get(self, endpoint: str) -> EndpointSignals | None:
        """The endpoint's signals as of now (the estimate settled first). On the event loop only."""
        s = self._by_endpoint.get(endpoint)
        if s is not None and s.pending:
            self._settle(s, self.clock())
        return s

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
        matched, load, waiting = 0, 0.0, 0.0
        for c in decision.candidates:
            if c.endpoint == ep:
                matched, load, waiting = c.matched_tokens, c.load, c.waiting
                break
        uncached = decision.prompt_tokens - matched
        if uncached < 0:
            uncached = 0
        held = decision.prompt_tokens - uncached
        s = self._of(ep)
        now = self.clock()
        if s.pending:
            self._settle(s, now)
        ticket = _Ticket(ep, uncached, s.prefill_tokens + uncached, load, now, held,
                         s.prefill_matched_tokens + held)
        s.prefill_tokens += uncached
        s.prefill_matched_tokens += held
        s.uncached_tokens += uncached
        ticket.idle = waiting <= 0 and s.prefill_clock.idle(now)
        s.prefill_clock.book(uncached, now)
        decision.signals = ticket
        if self.estimating and s.counters.mean_s is not None:
            if s.pending is None:
                s.pending = deque()
            s.pending.append(ticket)

    def on_served(self, decision: Decision, previous: str | None) -> None:
        t = decision.signals
        if not isinstance(t, _Ticket) or decision.served is None or decision.served == t.endpoint:
            return
        self._retire(t)
        t.endpoint = decision.served
        t.idle = False  # its first chunk will carry the failed attempt's time too
        s = self._of(t.endpoint)
        if not t.prefilled:
            s.prefill_clock.book(t.uncached, self.clock())
        t.ahead = s.prefill_tokens + t.uncached
        t.matched_ahead = s.prefill_matched_tokens + t.matched
        s.uncached_tokens += t.uncached
        if t.prefilled:
            s.decoding += 1
        else:
            s.prefill_tokens += t.uncached
            s.prefill_matched_tokens += t.matched
            if self.estimating and s.counters.mean_s is not None:  # its old endpoint's queue skips it now
                if s.pending is None:
                    s.pending = deque()
                s.pending.append(t)

    def on_first_chunk(self, decision: Decision) -> None:
        t = decision.signals
        if self.estimating:
            self._stop_estimating()
        if not isinstance(t, _Ticket) or (t.prefilled and not t.estimated):
            return
        s = self._of(t.endpoint)
        if not t.prefilled:
            t.prefilled = True
            s.prefill_tokens = max(0, s.prefill_tokens - t.uncached)
            s.prefill_matched_tokens = max(0, s.prefill_matched_tokens - t.matched)
            s.decoding += 1
        t.estimated = False
        ttft = self.clock() - t.at
        s.ttft_s = ttft if s.ttft_s is None else s.ttft_s + TTFT_EWMA_ALPHA * (ttft - s.ttft_s)
        if self.ttft_model:
            if s.model is None:
                s.model = TtftModel()
            s.model.observe(t.ahead, t.load, ttft, t.matched_ahead)
        if t.idle:
            s.prefill_clock.learn(t.uncached, t.load, ttft)
            self._unread.add(t.endpoint)

    def on_ended(self, decision: Decision) -> None:
        t = decision.signals
        if isinstance(t, _Ticket):
            t.ended = True  # an estimate queue still holding it skips it
            self._retire(t)
            decision.signals = None

    def _retire(self, t: _Ticket) -> None:
        s = self._by_endpoint.get(t.endpoint)
        if s is None:
            return  # dropped meanwhile: nothing left to retire from
        u = t.uncached
        s.uncached_tokens = s.uncached_tokens - u if s.uncached_tokens > u else 0
        if t.prefilled:
            s.decoding = s.decoding - 1 if s.decoding > 0 else 0
        else:
            s.prefill_tokens = s.prefill_tokens - u if s.prefill_tokens > u else 0
            m = t.matched
            s.prefill_matched_tokens = s.prefill_matched_tokens - m if s.prefill_matched_tokens > m else 0

    # ---- the BUFFERED-mode estimate ----
    def scraped(self, endpoint: str, stats: EngineStats) -> None:
        """A scrape of `endpoint` (LoadTracker.subscribe_scrapes): its TTFT histogram updates the mean."""
        if stats.ttft_count is None:
            return
        s = self._of(endpoint)
        s.counters.scraped(stats.ttft_sum, stats.ttft_count)
        if s.pending:
            self._settle(s, self.clock())

    def _settle(self, s: EndpointSignals, now: float) -> None:
        """Retire the prefill of every request decided at least one mean TTFT ago (the queue is in decision
        order); requests that ended, were seen prefilled or moved to another endpoint just leave it."""
        mean, pending = s.counters.mean_s, s.pending
        if mean is None or pending is None:
            return
        horizon = now - mean
        while pending:
            t = pending[0]
            if t.ended or t.prefilled or self._by_endpoint.get(t.endpoint) is not s:
                pending.popleft()
                continue
            if t.at > horizon:
                break
            pending.popleft()
            t.prefilled = t.estimated = True
            s.prefill_tokens = max(0, s.prefill_tokens - t.uncached)
            s.prefill_matched_tokens = max(0, s.prefill_matched_tokens - t.matched)
            s.decoding += 1

    def _stop_estimating(self) -> None:
        """The response path shows first chunks: from now on prefill is retired when it is seen. Requests the
        estimate has not retired yet wait for their own first chunk."""
        self.estimating = False
        for s in self._by_endpoint.values():
            s.pending = None

    # ---- the fleet ----
    def drop(self, endpoint: str) -> None:
        self._by_endpoint.pop(endpoint, None)
        self._unread.discard(endpoint)
        self._read.pop(endpoint, None)

    # ---- the price floor a large pool's scan bounds costs with ----
    def unread(self) -> set[str]:
        """Endpoints whose learned prices changed since a scan last read them: a scan scores them."""
        return self._unread

    def read(self, candidates: Sequence[Candidate]) -> None:
        """A scan read these candidates' prices (`Decider.signalled`): the floor takes them in."""
        unread, floor = self._unread, self._floor
        for c in candidates:
            if c.endpoint not in unread:
                continue
            unread.discard(c.endpoint)
            if c.idle_ttft_base_s is None or c.idle_ttft_per_token_s is None or c.idle_ttft_per_running_s is None:
                continue
            prices = (c.idle_ttft_base_s, c.idle_ttft_per_token_s, c.idle_ttft_per_running_s)
            self._read[c.endpoint] = prices
            floor = prices if floor is None else (min(floor[0], prices[0]), min(floor[1], prices[1]),
                                                  min(floor[2], prices[2]))
        self._floor = floor

    def price_floor(self, prior: Prices) -> Prices:
        """Prices (base, per token, per running) no endpoint outside `unread` is below: the prior's (what an
        endpoint that never learned uses) and every learned endpoint's as last read."""
        now = self.clock()
        if self._read and now - self._floor_at >= FLOOR_REFRESH_S:
            self._floor_at = now
            read = self._read.values()
            self._floor = (min(p[0] for p in read), min(p[1] for p in read), min(p[2] for p in read))
        floor = self._floor
        if floor is None:
            return prior
        return min(prior[0], floor[0]), min(prior[1], floor[1]), min(prior[2], floor[2])

    def read_prices(self, endpoint: str) -> Prices | None:
        """The endpoint's learned prices as a scan last read them (None: it never learned, or a scan has not
        read it since: then it is in `unread`)."""
        return self._read.get(endpoint)
