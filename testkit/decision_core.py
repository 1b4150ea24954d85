"""The sidecar's decision core on a simulated clock, for replaying recorded streams (testkit/decision_replay.py).

Built as loadaware/app.py builds it: the policy, the registry, the load tracker (ranking too), the token
signals, endpoint health, the model map, session affinity, stored-response holders and the prefix source,
subscribed to the lifecycle in the app's order. What the outside world would say is set by the caller: the
exact source's answer (`exact.answer`), scrapes (`scraped`) and each engine's models (`serve_models`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadaware.config import Settings
from loadaware.fleet.health import EndpointHealth, HealthOptions
from loadaware.fleet.models import EndpointModels, ServedModels
from loadaware.fleet.registry import EndpointRegistry, FleetEvents
from loadaware.fleet.state_holders import StateHolders
from loadaware.lifecycle import RequestLifecycle
from loadaware.load.signals import SignalTracker
from loadaware.load.tracker import EngineStats, LoadTracker
from loadaware.policies import make_policy
from loadaware.prefix.approx import ApproxIndex, ApproxPrefixSource
from loadaware.prefix.combined import CombinedPrefixSource, Member
from loadaware.prefix.source import PrefixSource
from loadaware.prefix.wiring import APPROX_TOKEN_BLOCK
from loadaware.routing.affinity import SessionAffinity
from loadaware.routing.pipeline import Decider
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


class DecisionCore:
    def __init__(self, policy: str, source: str, endpoints: Sequence[str], clock: SimClock, settings: Settings,
                 text_encoder: bool) -> None:
        s = settings
        self.clock = clock
        self.lifecycle = RequestLifecycle()
        self.registry = EndpointRegistry(endpoints)
        self.loads = LoadTracker(s.scrape_stale_s, clock=clock)
        self.signals = SignalTracker(clock)
        self.health = EndpointHealth(HealthOptions(s.eject_after_failures, s.ejection_base_s, s.ejection_max_s,
                                                   s.unreachable_after_scrapes, s.max_ejection_percent), clock=clock)
        self.models = EndpointModels(3 * s.models_refresh_s, clock)
        self.state = StateHolders(None, s.state_max_entries, s.state_ttl_s, s.state_probe_timeout_s, clock=clock)
        self.exact = FixedAnswer()
        self.approx = self._approx(s, clock) if source in ("approx", "exact+approx") else None
        prefix = self._prefix(source)
        encoder = TextUnits() if text_encoder and source == "approx" else None
        self.decider = Decider(make_policy(policy, s.loadaware_beta), self.registry, self.loads, self.lifecycle,
                               encoder, prefix, fallbacks=s.fallback_endpoints, health=self.health,
                               models=self.models, ranking=self.loads, signals=self.signals,
                               affinity=SessionAffinity(s.session_max_entries, s.session_ttl_s, clock=clock)
                               if s.session_header else None, state=self.state)
        self.lifecycle.subscribe(self.loads)
        self.lifecycle.subscribe(self.signals)
        self.lifecycle.subscribe_progress(self.signals)
        self.loads.subscribe_scrapes(self.signals.scraped)
        if self.approx is not None:
            self.lifecycle.subscribe(self.approx)
        self.lifecycle.subscribe(self.health)
        self.lifecycle.subscribe_outcomes(self.health)
        self.registry.subscribe(FleetEvents(self.loads.join, self._removed))
        for endpoint in self.registry.snapshot():
            self.loads.join(endpoint)

    @staticmethod
    def _approx(s: Settings, clock: SimClock) -> ApproxPrefixSource:
        index = ApproxIndex(max(1, s.approx_capacity_tokens // APPROX_TOKEN_BLOCK), APPROX_TOKEN_BLOCK, s.approx_ttl_s)
        return ApproxPrefixSource(index, Metrics("replay"), clock)

    def _prefix(self, source: str) -> PrefixSource | None:
        if source == "exact":
            return self.exact
        if source == "approx":
            return self.approx
        if source == "exact+approx":
            return CombinedPrefixSource([Member(self.exact, set, complete=False)], self.approx)
        return None

    def scraped(self, endpoint: str, running: float, waiting: float, kv_usage: float | None, ttft_sum: float,
                ttft_count: float, capacity: float | None) -> None:
        self.loads.record(endpoint, EngineStats(running, waiting, kv_usage, self.clock(), ttft_sum, ttft_count,
                                                capacity))

    def leave(self, endpoint: str) -> None:
        self.registry.set(ep for ep in self.registry.snapshot() if ep != endpoint)

    def join(self, endpoint: str) -> None:
        self.registry.set((*self.registry.snapshot(), endpoint))

    def _removed(self, endpoint: str) -> None:
        """The endpoint left the fleet: everything that knew it forgets it, as the app's fleet events do."""
        self.loads.drop(endpoint)
        self.signals.drop(endpoint)
        self.health.forget(endpoint)
        if self.approx is not None:
            self.approx.drop(endpoint)
        if self.decider.queued is not None:
            self.decider.queued.index.drop(endpoint)
        self.models.forget(endpoint)

    def serve_models(self, endpoint: str, ids: set[str]) -> None:
        self.models.record(endpoint, ServedModels(frozenset(ids)))


def build_core(policy: str, source: str, endpoints: Sequence[str], clock: SimClock, settings: Settings,
               text_encoder: bool = False) -> Any:
    return DecisionCore(policy, source, endpoints, clock, settings, text_encoder)
