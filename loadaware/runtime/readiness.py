"""When the sidecar may take traffic (the gRPC health service's SERVING), and in words why not.

Ready = endpoints known, their loads scraped once, the engines' models asked once (else an unknown model
could reach an engine in the first seconds), the LMCache instance map tried once (when configured), and no
required background task failing over and over (tasks/supervisor.py).
"""

from __future__ import annotations

from loadaware.fleet.models_poller import ModelsPoller
from loadaware.fleet.registry import EndpointRegistry
from loadaware.load.scraper import MetricsScraper
from loadaware.prefix.lmcache.resolver import InstanceResolver
from loadaware.tasks.supervisor import Supervisor

# Without these the sidecar cannot decide well (or at all): readiness drops while one keeps failing.
REQUIRED_TASKS = ("scraper", "endpoints-file", "readiness")


def is_required(task: str) -> bool:
    return task in REQUIRED_TASKS or task.startswith("discovery-")


class Readiness:
    def __init__(self, registry: EndpointRegistry, scraper: MetricsScraper, supervisor: Supervisor,
                 models_poller: ModelsPoller | None, resolver: InstanceResolver | None) -> None:
        self.registry = registry
        self.scraper = scraper
        self.supervisor = supervisor
        self.models_poller = models_poller
        self.resolver = resolver
        # The scrape round that must finish first (see _scraped_since_fleet): a fleet known at start needs
        # the first round; one found later, the round after the one running when it arrived.
        self._fleet_round: int | None = 1 if registry.snapshot() else None

    def ready(self) -> bool:
        return (not self.supervisor.failing() and self.registry.ready and bool(self.registry.snapshot())
                and self._scraped_since_fleet()
                and (self.models_poller is None or self.models_poller.asked(self.registry.snapshot()))
                and (self.resolver is None or self.resolver.attempts > 0))

    def reason(self) -> str:
        """Why not ready ("" when ready): a failing task first, as it is what an operator must fix."""
        if self.ready():
            return ""
        failing = self.supervisor.failing()
        if failing:
            return "; ".join(f"task {name} keeps failing: {reason}" for name, reason in failing.items())
        if not self.registry.snapshot():
            return "no endpoints"
        return "waiting for the first scrape round, models fetch or LMCache instance map"

    def _scraped_since_fleet(self) -> bool:
        """A scrape round over the fleet has finished. A fleet that discovery finds after start may arrive
        while a round over the empty set is running; that round must not count, so wait for the next."""
        if not self.registry.snapshot():
            return False
        if self._fleet_round is None:
            self._fleet_round = self.scraper.rounds + 2
        return self.scraper.rounds >= self._fleet_round
