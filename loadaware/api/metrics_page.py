"""The /metrics page: the gauges that are read rather than counted are brought up to date, then rendered.

Off the event loop, in a thread (docs/architecture.md, "Fleet size"): what the refresh reads is either copied
atomically (dict copies, the registry's tuple) or a single lookup. An endpoint that leaves meanwhile may get a
series back from the thread: it is forgotten again once the thread is done.
"""

from __future__ import annotations

from loadaware.api.offloop import off_loop
from loadaware.api.view import FleetView, SidecarView
from loadaware.load.signals import SignalTracker
from loadaware.prefix.working_set import BLOCK_TOKENS
from loadaware.telemetry.epp import PodLoad
from loadaware.telemetry.metrics import Metrics


class MetricsPage:
    def __init__(self, view: SidecarView, metrics: Metrics) -> None:
        self.fleet = view.fleet
        self.prefix = view.prefix
        self.tokenizer = view.decision.tokenizer
        self.metrics = metrics  # the only thing written: the gauges read at render time
        self._credited_seen = 0

    async def render(self) -> bytes:
        registry = self.fleet.registry
        fleet = registry.snapshot()
        text = await off_loop(lambda: self.render_now(fleet))
        if registry.snapshot() is not fleet:
            for endpoint in fleet:
                if endpoint not in registry:
                    self.metrics.forget_endpoint(endpoint)
        return text

    def render_now(self, fleet: tuple[str, ...]) -> bytes:
        self.prefix.sources.refresh_gauges()
        for endpoint in fleet:  # every endpoint has a state series, not only those that changed
            self.metrics.routing_state_now(endpoint, self.fleet.health.state(endpoint))
        if self.tokenizer is not None:
            pieces = self.tokenizer.tokenizer.pieces
            self.metrics.tokenizer_pieces_seen(pieces.hits, pieces.misses, pieces.enabled, pieces.cached_tokens,
                                               pieces.cached_pieces)
            if self.tokenizer.conversations is not None:
                self.metrics.tokenizer_conversations_seen(self.tokenizer.conversations.cache.counts())
        self.metrics.fleet_kv_capacity.set(self.fleet.loads.kv_capacity_tokens())
        ws = self.prefix.working_set
        if ws is not None:  # two int reads: safe from this thread
            self.metrics.working_set_tokens.set(ws.recurring_blocks() * BLOCK_TOKENS)
            self.metrics.working_set_new_heads.set(ws.singletons)
        queued = self.prefix.queued
        if queued is not None:  # int reads; the counter catches up with the running total
            self.metrics.queued_blocks.set(queued.index.total_blocks)
            credited = queued.credited_tokens
            if credited > self._credited_seen:
                self.metrics.queued_credited.inc(credited - self._credited_seen)
                self._credited_seen = credited
        if self.fleet.signals is not None:
            self._token_signals(self.fleet.signals, fleet)
        return self.metrics.render(self.fleet.loads.snapshot, fleet)

    def _token_signals(self, signals: SignalTracker, fleet: tuple[str, ...]) -> None:
        now = signals.clock()
        peek = signals.peek  # off the loop: a pure read, never the settling `get`
        # the clock's lead read, not viewed: a render off the loop never refits its model
        self.metrics.token_signals_many(
            (endpoint, sig.prefill_tokens, sig.uncached_tokens, sig.decoding, sig.ttft_s, sig.prefill_clock.lead(now))
            for endpoint in fleet if (sig := peek(endpoint)) is not None)


def pool_loads(fleet: FleetView) -> list[PodLoad]:
    """Each endpoint's scraped load under its pod's name, for the endpoint picker's inference_pool_* gauges."""
    loads, pod_of = fleet.loads, fleet.catalog.pod
    fresh, now = loads.fresh_stats, loads.clock()  # one reading for the whole fleet: one page is one moment
    return [PodLoad(pod_of(ep) or ep, None, None, None) if (st := fresh(ep, now)) is None else
            PodLoad(pod_of(ep) or ep, st.running, st.waiting, st.kv_usage) for ep in fleet.registry.snapshot()]
