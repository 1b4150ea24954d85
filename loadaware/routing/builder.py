"""The one place the decision core is built: by the sidecar (loadaware/app.py) and by the simulator
(experiment/product_router.py), so the simulator runs exactly what the sidecar runs.

`build_core` builds the core's parts from its options (the settings table's values: loadaware/config.py,
`core_options`) and subscribes them to the request lifecycle in the sidecar's order: the decider's own listeners
(queued prefixes, session affinity), then the in-flight counts, the token signals, the approximate prefix index,
endpoint health. The caller supplies what comes from outside: the registry, the clock, the tokenizer, the prefix
source, the stored-response probe. `build_decider` wires the pipeline's stages (routing/pipeline.py) from parts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loadaware.fleet.health import EndpointHealth, HealthOptions, StateListener
from loadaware.fleet.models import EndpointModels
from loadaware.fleet.registry import EndpointRegistry, FleetEvents
from loadaware.fleet.state_holders import Probe, StateHolders
from loadaware.lifecycle import LifecycleListener, RequestLifecycle
from loadaware.load.signals import SignalTracker
from loadaware.load.tracker import LoadTracker
from loadaware.policies import Policy, make_policy
from loadaware.prefix.queued import QueuedPrefixes
from loadaware.prefix.source import PrefixSource
from loadaware.prefix.working_set import WorkingSet
from loadaware.routing.affinity import SessionAffinity
from loadaware.routing.candidates import CandidateData, Loads
from loadaware.routing.filters import Eligibility, ModelPools, PoolFilter
from loadaware.routing.pipeline import Decider
from loadaware.routing.producers import Producers, PromptEncoder, StateLocator
from loadaware.routing.selection import Ranking, Selection
from loadaware.routing.sticky import Stickiness

MODELS_STALE_ROUNDS = 3  # a failing engine keeps its last model list for this many refresh periods


@dataclass(frozen=True)
class CoreOptions:
    """What the decision core reads of the configuration (loadaware/config.py `core_options` fills it from the
    settings; the defaults here are the settings table's)."""

    policy: str = "loadaware"
    beta: float = 1.0
    fallbacks: int = 2
    scrape_stale_s: float = 5.0
    health: HealthOptions = field(default_factory=HealthOptions)
    models_refresh_s: float = 10.0  # 0: model awareness off
    sessions: bool = False  # --session-header given
    session_max_entries: int = 100_000
    session_ttl_s: float = 600.0
    state_max_entries: int = 100_000
    state_ttl_s: float = 86_400.0
    state_probe_timeout_s: float = 0.5


@dataclass
class CoreInputs:
    """What the core hears from outside it: built by the caller (the app from its flags, the simulator)."""

    registry: EndpointRegistry
    lifecycle: RequestLifecycle = field(default_factory=RequestLifecycle)
    clock: Callable[[], float] = time.monotonic
    tokenizer: PromptEncoder | None = None
    prefix_source: PrefixSource | None = None
    prefix_listeners: Sequence[LifecycleListener] = ()  # the approximate index, which records each decision
    probe: Probe | None = None  # asks the engines for a stored response (None: only learned holders)
    on_health_change: StateListener | None = None
    ttft_model: bool = False  # the token signals learn each engine's TTFT model (a research arm reads it)


@dataclass
class DecisionCore:
    decider: Decider
    lifecycle: RequestLifecycle
    registry: EndpointRegistry
    loads: LoadTracker
    signals: SignalTracker
    health: EndpointHealth
    models: EndpointModels | None
    state: StateHolders


def build_core(options: CoreOptions, inputs: CoreInputs, policy: Policy | None = None) -> DecisionCore:
    """The decision core from its options (`policy`: an instance to use instead of `options.policy`, e.g. a
    simulator's research arm)."""
    o, clock, lifecycle = options, inputs.clock, inputs.lifecycle
    loads = LoadTracker(o.scrape_stale_s, clock=clock)
    signals = SignalTracker(clock, ttft_model=inputs.ttft_model)
    health = EndpointHealth(o.health, clock=clock, on_change=inputs.on_health_change)
    models = EndpointModels(MODELS_STALE_ROUNDS * o.models_refresh_s, clock) if o.models_refresh_s else None
    state = StateHolders(inputs.probe, o.state_max_entries, o.state_ttl_s, o.state_probe_timeout_s, clock=clock)
    affinity = SessionAffinity(o.session_max_entries, o.session_ttl_s, clock=clock) if o.sessions else None
    decider = build_decider(policy or make_policy(o.policy, o.beta), inputs.registry, loads, lifecycle,
                            tokenizer=inputs.tokenizer, prefix_source=inputs.prefix_source, fallbacks=o.fallbacks,
                            health=health, models=models, ranking=loads, signals=signals, affinity=affinity,
                            state=state)
    # Counts first: a later listener failing must not leak one.
    lifecycle.subscribe(loads)
    lifecycle.subscribe(signals)
    lifecycle.subscribe_progress(signals)
    loads.subscribe_scrapes(signals.scraped)  # engines' TTFT histograms: the BUFFERED prefill estimate
    for listener in inputs.prefix_listeners:
        lifecycle.subscribe(listener)
    lifecycle.subscribe(health)
    lifecycle.subscribe_outcomes(health)
    core = DecisionCore(decider, lifecycle, inputs.registry, loads, signals, health, models, state)
    inputs.registry.subscribe(FleetEvents(loads.join, lambda ep: forget(core, ep)))
    for endpoint in inputs.registry.snapshot():  # the set before the subscription (flags, a file's first)
        loads.join(endpoint)
    return core


def forget(core: DecisionCore, endpoint: str) -> None:
    """An endpoint left the fleet: every part of the core that knew it forgets it (a returning one starts afresh)."""
    core.loads.drop(endpoint)
    core.signals.drop(endpoint)
    core.health.forget(endpoint)
    if core.decider.data.queued is not None:
        core.decider.data.queued.index.drop(endpoint)
    if core.models is not None:
        core.models.forget(endpoint)


def build_decider(policy: Policy, registry: EndpointRegistry, loads: Loads, lifecycle: RequestLifecycle,
                  tokenizer: PromptEncoder | None = None, prefix_source: PrefixSource | None = None,
                  fallbacks: int = 0, health: Eligibility | None = None, models: ModelPools | None = None,
                  ranking: Ranking | None = None, signals: SignalTracker | None = None,
                  working_set: WorkingSet | None = None, affinity: SessionAffinity | None = None,
                  state: StateLocator | None = None) -> Decider:
    """The pipeline's stages from the core's parts. What the policy declares it reads decides what is built: the
    fleet's prefix working set (Needs.working_set; the engines' scraped KV capacity sizes it), the prompts queued on
    engines that queue (Needs.queued_prefixes; it hears of each request's life to hold and release)."""
    needs = policy.needs
    if working_set is None and needs.working_set:
        working_set = WorkingSet()
    queued = QueuedPrefixes() if needs.queued_prefixes else None
    if queued is not None:
        lifecycle.subscribe(queued)
    data = CandidateData(loads, signals, working_set, queued)
    stickiness = None
    if affinity is not None:
        # A session's requests stick to its endpoint while it can take them; it hears who served, so a session
        # follows the proxy's retries.
        lifecycle.subscribe(affinity)
        stickiness = Stickiness(affinity, data.waiting)
    return Decider(policy, PoolFilter(registry, health, models), Producers(registry, tokenizer, prefix_source, state),
                   Selection(policy, data, registry, ranking, fallbacks), lifecycle, stickiness)
