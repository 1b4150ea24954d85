"""The /metrics page: the gauges that are read rather than counted are brought up to date, then rendered.

Off the event loop, in a thread (docs/architecture.md, "Fleet size"): what the refresh reads is either copied
atomically (dict copies, the registry's tuple) or a single lookup. An endpoint that leaves meanwhile may get a
series back from the thread: it is forgotten again once the thread is done.
"""

from __future__ import annotations

from loadaware.api.offloop import off_loop
from loadaware.fleet.discovery.catalog import DiscoveryCatalog
from loadaware.fleet.health import EndpointHealth
from loadaware.fleet.registry import EndpointRegistry
from loadaware.load.signals import SignalTracker
from loadaware.load.tracker import LoadTracker
from loadaware.prefix.queued import QueuedPrefixes
from loadaware.prefix.wiring import PrefixWiring
from loadaware.prefix.working_set import BLOCK_TOKENS, WorkingSet
from loadaware.telemetry.epp import PodLoad
from loadaware.telemetry.metrics import Metrics
from loadaware.tokenize.tokenizer import AsyncTokenizer


class MetricsPage:
    def __init__(self, metrics: Metrics, registry: EndpointRegistry, loads: LoadTracker, health: EndpointHealth,
                 signals: SignalTracker, prefixes: PrefixWiring, tokenizer: AsyncTokenizer | None,
                 working_set: WorkingSet | None = None, queued: QueuedPrefixes | None = None) -> None:
        self.working_set = working_set
        self.queued = queued
        self._credited_seen = 0
        self.metrics = metrics
        self.registry = registry
        self.loads = loads
        self.health = health
        self.signals = signals
        self.prefixes = prefixes
        self.tokenizer = tokenizer

    async def render(self) -> bytes:
        fleet = self.registry.snapshot()
        text = await off_loop(lambda: self.render_now(fleet))
        if self.registry.snapshot() is not fleet:
            for endpoint in fleet:
                if endpoint not in self.registry:
                    self.metrics.forget_endpoint(endpoint)
        return text

    def render_now(self, fleet: tuple[str, ...]) -> bytes:
        self.prefixes.refresh_gauges()
        for endpoint in fleet:  # every endpoint has a state series, not only those that changed
            self.metrics.routing_state_now(endpoint, self.health.state(endpoint))
        if self.tokenizer is not None:
            pieces = self.tokenizer.tokenizer.pieces
            self.metrics.tokenizer_pieces_seen(pieces.hits, pieces.misses, pieces.enabled)
            if self.tokenizer.conversations is not None:
                self.metrics.tokenizer_conversations_seen(self.tokenizer.conversations.cache.counts())
        self.metrics.fleet_kv_capacity.set(self.loads.kv_capacity_tokens())
        ws = self.working_set
        if ws is not None:  # two int reads: safe from this thread
            self.metrics.working_set_tokens.set(ws.recurring_blocks() * BLOCK_TOKENS)
            self.metrics.working_set_new_heads.set(ws.singletons)
        queued = self.queued
        if queued is not None:  # int reads; the counter catches up with the running total
            self.metrics.queued_blocks.set(queued.index.total_blocks)
            credited = queued.credited_tokens
            if credited > self._credited_seen:
                self.metrics.queued_credited.inc(credited - self._credited_seen)
                self._credited_seen = credited
        now = self.signals.clock()
        for endpoint in fleet:
            sig = self.signals.peek(endpoint)  # off the loop: a pure read, never the settling `get`
            if sig is not None:  # the clock's lead read, not viewed: a render off the loop never refits its model
                lane = sig.prefill_clock.lead(now)
                self.metrics.token_signals(endpoint, sig.prefill_tokens, sig.uncached_tokens, sig.decoding, sig.ttft_s,
                                           lane)
        return self.metrics.render(self.loads.snapshot, fleet)


def pool_loads(registry: EndpointRegistry, loads: LoadTracker, catalog: DiscoveryCatalog) -> list[PodLoad]:
    """Each endpoint's scraped load under its pod's name, for the endpoint picker's inference_pool_* gauges."""
    rows = []
    for ep in registry.snapshot():
        st = loads.fresh_stats(ep)
        pod = catalog.entry(ep).pod or ep
        rows.append(PodLoad(pod, None, None, None) if st is None else PodLoad(pod, st.running, st.waiting,
                                                                              st.kv_usage))
    return rows
