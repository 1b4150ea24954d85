"""One read-only view of the running sidecar: what Explain, ListEndpoints, GetConfig, /debug/state and the
/metrics page read.

The composition root (app.py) builds it once from the objects it wired; the readers only read through it (the
metrics page writes into the metrics it is given, never into what the view names). It is grouped as the readers
ask: the fleet, where prompts are cached, the decision, the process.

It lives in api/ because its readers do, and imports run one way: what it holds from above this layer (the
readiness of runtime/, the ext_proc server's stream counts, the settings' description) it names by what is
asked of it, a protocol or a callable, not by its type; so does it the prefix sources' wiring, whose shape is
the prefix layer's own business.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from loadaware.admission.controller import AdmissionController
from loadaware.fleet.discovery.catalog import DiscoveryCatalog
from loadaware.fleet.health import EndpointHealth
from loadaware.fleet.models import EndpointModels
from loadaware.fleet.registry import EndpointRegistry
from loadaware.load.signals import SignalTracker
from loadaware.load.tracker import LoadTracker
from loadaware.prefix.lmcache.bridge import InstanceBridge
from loadaware.prefix.queued import QueuedPrefixes
from loadaware.prefix.working_set import WorkingSet
from loadaware.routing.pipeline import Decider
from loadaware.tokenize.tokenizer import AsyncTokenizer

Rows = Callable[[], list[dict[str, Any]]]  # a JSON-able list, read when a page asks


class ReadinessView(Protocol):
    """runtime/readiness.py's Readiness, as the pages ask it."""

    def ready(self) -> bool: ...
    def reason(self) -> str: ...


class PrefixSources(Protocol):
    """prefix/wiring.py's PrefixWiring, as the pages ask it."""

    def state(self) -> dict[str, object]: ...
    def refresh_gauges(self) -> None: ...


class StreamCounts(Protocol):
    """extproc/stream.py's ExtProcServicer, as /debug/state asks it."""

    open_streams: int
    modes: dict[str, int]


@dataclass(frozen=True)
class FleetView:
    """The engines: who is routable, what discovery says of each, their loads, routing health, token signals
    and models."""

    registry: EndpointRegistry
    catalog: DiscoveryCatalog
    loads: LoadTracker
    health: EndpointHealth
    signals: SignalTracker | None = None  # None: token signals not kept (a test's fleet)
    models: EndpointModels | None = None  # None: model awareness off (--models-refresh-s 0)


@dataclass(frozen=True)
class PrefixView:
    """Where prompts are cached: the prefix sources, LMCache's instance map, and what the selected policy keeps
    of the fleet's prefixes (None when it does not ask for them)."""

    sources: PrefixSources
    bridge: InstanceBridge
    working_set: WorkingSet | None = None
    queued: QueuedPrefixes | None = None


@dataclass(frozen=True)
class DecisionView:
    """The decision core and what feeds it: Explain runs the decider on a copy of its policy."""

    decider: Decider
    policy: str  # the effective policy's name (--policy auto resolved)
    beta: float
    tokenizer: AsyncTokenizer | None = None
    admission: AdmissionController | None = None  # None: --admission off


@dataclass(frozen=True)
class ProcessView:
    """The process around the decision: readiness, the supervised tasks, open streams, the settings."""

    readiness: ReadinessView
    tasks: Rows  # each supervised task's state
    streams: StreamCounts
    settings: Rows  # every setting with its value and origin (flag, env, default)


@dataclass(frozen=True)
class SidecarView:
    fleet: FleetView
    prefix: PrefixView
    decision: DecisionView
    process: ProcessView
