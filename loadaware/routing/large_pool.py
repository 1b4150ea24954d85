"""A large pool as a policy's own selection reads it (policies/large_pool.py, LargePool): the fleet's load order,
the pool's members, the candidates' data, built per decision by the selection stage (routing/selection.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from loadaware.fleet.registry import EndpointRegistry
from loadaware.load.order import LoadOrder
from loadaware.policies import Candidate
from loadaware.policies.ttft_model import Prices
from loadaware.routing.candidates import CandidateData
from loadaware.routing.context import DecisionContext
from loadaware.routing.pruning import pool_load


class FleetPool:
    """The LargePool of one decision. `ordering()`: the fleet's load order (load/tracker.py), read only when a
    policy asks for it (reading it expires stale scrapes)."""

    def __init__(self, ctx: DecisionContext, data: CandidateData, registry: EndpointRegistry,
                 ordering: Callable[[], LoadOrder], limit: int) -> None:
        self.ctx, self.data, self.registry, self._ordering = ctx, data, registry, ordering
        self.prompt_tokens = ctx.prompt_tokens
        self.limit = limit
        self.size = ctx.pool_size
        self.keep = ctx.sticky
        fleet = registry.snapshot()
        self._whole_fleet = ctx.endpoints is fleet
        self.whole = self._whole_fleet and not ctx.excluded
        self.signals = data.signals is not None
        self._members = registry.members() if self._whole_fleet else frozenset(ctx.endpoints)
        self._order: LoadOrder | None = None
        self._now: float | None = None

    @property
    def order(self) -> LoadOrder:
        if self._order is None:
            self._order = self._ordering()
        return self._order

    def ordered(self) -> bool:
        return len(self.order) == len(self.registry.snapshot())  # joined and dropped with the fleet

    def total_load(self) -> float:
        return pool_load(self.order, self.ctx.endpoints, self._whole_fleet, self.ctx.excluded)

    def lexical(self) -> tuple[str, ...]:
        return self.registry.lexical()

    def position(self, endpoint: str) -> int:
        return self.registry.position(endpoint)

    def load(self, endpoint: str) -> float:
        return self.order.load(endpoint) or 0.0

    def least(self, n: int, skip: Callable[[str], bool]) -> list[str]:
        return self.order.least(n, skip)

    def by_load(self) -> Iterable[tuple[float, Sequence[str]]]:
        return self.order.by_load()

    def in_pool(self, endpoint: str) -> bool:
        return endpoint in self._members and endpoint not in self.ctx.excluded

    def must_score(self) -> dict[str, int]:
        n_tokens, in_pool = self.prompt_tokens, self.in_pool
        must = {ep: min(n, n_tokens) for ep, n in self.ctx.matches.items() if n > 0 and in_pool(ep)}
        signals, queued = self.data.signals, self.data.queued
        always = (*(signals.unread() if signals is not None else ()), *(queued.engines() if queued is not None else ()),
                  *((self.keep,) if self.keep is not None else ()))
        for ep in always:
            if in_pool(ep):
                must.setdefault(ep, 0)
        return must

    def all_queue(self) -> bool:
        """Every endpoint of the pool queues: a fresh scrape with waiting > 0, as its candidate would show (the load
        tracker's set, current once the order expired the stale). A pool with fewer queueing endpoints than
        members answers at once."""
        queueing: set[str] | None = getattr(self.data.loads, "queueing", None)
        members, excluded = self._members, self.ctx.excluded
        if queueing is None or len(queueing) < len(members) - len(excluded):
            return False
        return any(ep not in excluded for ep in members) and \
            all(ep in queueing for ep in members if ep not in excluded)

    def candidate(self, endpoint: str, matched: int, load: float) -> Candidate:
        if self.data.signals is None:
            return Candidate(endpoint, matched, load)
        if self._now is None:
            self._now = self.data.signals.clock()  # once per decision
        return self.data.signalled(endpoint, matched, load, self._now)

    def credit(self, candidates: Sequence[Candidate]) -> None:
        self.data.credit_queued(self.ctx, candidates)

    def working_view(self, candidates: Sequence[Candidate]) -> tuple[float | None, float]:
        return self.data.working_view(self.ctx, candidates)

    def fill_working_set(self, candidates: Sequence[Candidate],
                         view: tuple[float | None, float] | None = None) -> None:
        if view is None:
            self.data.fill_working_set(self.ctx, candidates)
        elif self.ctx.sampled is not None:
            for c in candidates:
                c.cache_demand, c.prefix_routes = view

    def mark_read(self, candidates: Sequence[Candidate]) -> None:
        if self.data.signals is not None:
            self.data.signals.read(candidates)

    def price_floor(self, prior: Prices) -> Prices:
        assert self.data.signals is not None
        return self.data.signals.price_floor(prior)

    def prices_of(self, endpoint: str) -> Prices | None:
        assert self.data.signals is not None
        return self.data.signals.read_prices(endpoint)
