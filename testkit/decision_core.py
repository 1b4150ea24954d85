"""The sidecar's decision core on a simulated clock, for replaying recorded streams (testkit/decision_replay.py):
built by the sidecar's own builder (loadaware/routing/builder.py) from the settings table. What the outside world
would say is set by the caller: the exact source's answer (`exact.answer`), scrapes (`scraped`), each engine's
models (`serve_models`), the fleet (`leave`, `join`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from loadaware.config import Settings, core_options
from loadaware.fleet.models import ServedModels
from loadaware.fleet.registry import EndpointRegistry
from loadaware.load.tracker import EngineStats
from loadaware.prefix.approx import ApproxIndex, ApproxPrefixSource
from loadaware.prefix.combined import CombinedPrefixSource, Member
from loadaware.prefix.source import PrefixSource
from loadaware.prefix.wiring import APPROX_TOKEN_BLOCK
from loadaware.routing.builder import CoreInputs, DecisionCore, build_core
from loadaware.telemetry.metrics import Metrics
from loadaware.tokenize.text_units import TextUnits


class SimClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FixedAnswer:
    """An exact prefix source whose answer the caller sets before each decision."""

    name = "simulated"
    exact = True

    def __init__(self) -> None:
        self.answer: dict[str, int] = {}

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        return self.answer


class SimulatedPrefix:
    """A simulated sidecar's prefix source: "exact" (the caller sets `exact.answer`: what LMCache or the KV-events
    index would say of the engines' caches), "approx" (the sidecar's own approximate index), "exact+approx" (both,
    combined as the sidecar combines stock LMCache with its record: LMCache names one holder per chunk, the
    record adds the others; loadaware/prefix/combined.py) or "none". Sized by the settings table's defaults."""

    def __init__(self, source: str, clock: Callable[[], float], settings: Settings | None = None) -> None:
        s = settings or Settings()
        self.exact = FixedAnswer()
        self.approx: ApproxPrefixSource | None = None
        if source in ("approx", "exact+approx"):
            index = ApproxIndex(max(1, s.approx_capacity_tokens // APPROX_TOKEN_BLOCK), APPROX_TOKEN_BLOCK,
                                s.approx_ttl_s)
            self.approx = ApproxPrefixSource(index, Metrics("simulated"), clock)
        self.source: PrefixSource | None = {"exact": self.exact, "approx": self.approx, "none": None}.get(source)
        if source == "exact+approx":
            self.source = CombinedPrefixSource([Member(self.exact, set, complete=False)], self.approx)
        elif source not in ("exact", "approx", "none"):
            raise ValueError(f"unknown source {source!r}")

    def listeners(self) -> tuple[ApproxPrefixSource, ...]:
        """What hears of each decision: the approximate index records where each prompt went."""
        return (self.approx,) if self.approx is not None else ()

    def watch(self, registry: EndpointRegistry) -> None:
        """The approximate index forgets an endpoint that leaves, as the app's prefix wiring does."""
        if self.approx is not None:
            registry.on_removed(self.approx.drop)


class ReplayedCore:
    """A decision core with its prefix source: "exact" (the caller's answer), "approx" (the sidecar's own index),
    "exact+approx" (both, combined as the sidecar combines LMCache with its record) or "none"."""

    def __init__(self, policy: str, source: str, endpoints: Sequence[str], clock: SimClock, settings: Settings,
                 text_encoder: bool) -> None:
        self.clock = clock
        prefix = SimulatedPrefix(source, clock, settings)
        self.exact = prefix.exact
        self.registry = EndpointRegistry(endpoints)
        self.core: DecisionCore = build_core(
            core_options(dataclasses.replace(settings, policy=policy)),
            CoreInputs(self.registry, clock=clock, tokenizer=TextUnits() if text_encoder and source == "approx"
                       else None, prefix_source=prefix.source, prefix_listeners=prefix.listeners()))
        prefix.watch(self.registry)
        self.decider, self.lifecycle, self.state = self.core.decider, self.core.lifecycle, self.core.state

    def leave(self, endpoint: str) -> None:
        self.registry.set(ep for ep in self.registry.snapshot() if ep != endpoint)

    def join(self, endpoint: str) -> None:
        self.registry.set((*self.registry.snapshot(), endpoint))

    def scraped(self, endpoint: str, running: float, waiting: float, kv_usage: float | None, ttft_sum: float,
                ttft_count: float, capacity: float | None) -> None:
        self.core.loads.record(endpoint, EngineStats(running, waiting, kv_usage, self.clock(), ttft_sum, ttft_count,
                                                     capacity))

    def serve_models(self, endpoint: str, ids: set[str]) -> None:
        assert self.core.models is not None
        self.core.models.record(endpoint, ServedModels(frozenset(ids)))


def build_replayed(policy: str, source: str, endpoints: Sequence[str], clock: SimClock, settings: Settings,
                   text_encoder: bool = False) -> ReplayedCore:
    return ReplayedCore(policy, source, endpoints, clock, settings, text_encoder)
