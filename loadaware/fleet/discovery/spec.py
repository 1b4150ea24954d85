"""What a discovery backend declares so that `--discovery` can select it (or, for a companion, so that it runs
beside the selected one): one `Backend` in its own module (fleet/discovery/backends/), listed once in
fleet/discovery/registry.py. The flag's parser and help, the start's checks and the app read these.

A backend reads plain option values: its `options` is a frozen dataclass whose fields are named after the
settings it reads, filled by `options_of` from anything with those attributes (the app's Settings).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, fields
from typing import Any

from loadaware.fleet.discovery.catalog import DiscoveryCatalog
from loadaware.fleet.discovery.metrics import DiscoveryMetrics
from loadaware.fleet.registry import EndpointRegistry

Task = Callable[[], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class NoOptions:
    """A backend that reads no setting."""


@dataclass(frozen=True)
class DiscoveryContext:
    """What a backend reports into: the registry directly (static, file) or the catalog (the rest), its metrics,
    and admission's cluster priorities (None: admission is off)."""

    registry: EndpointRegistry
    catalog: DiscoveryCatalog
    metrics: DiscoveryMetrics
    set_objectives: Callable[[dict[str, int]], None] | None = None


def always(options: Any) -> bool:
    return True


def no_problem(options: Any) -> str | None:
    return None


@dataclass(frozen=True)
class Backend:
    name: str  # --discovery's word (a mode), or the companion's name
    # (its options, the context) -> its background tasks, (name, coroutine function); built before the first
    # stream, so a backend may read its first set at once (the endpoints file does).
    build: Callable[[Any, DiscoveryContext], list[tuple[str, Task]]]
    options: type[Any] = NoOptions
    mode: bool = True  # selectable with --discovery; False: a companion, run when `wanted` says so
    finds_endpoints: bool = False  # finds the fleet itself: --endpoints / --endpoints-file are refused with it
    in_cluster: bool = False  # follows a Kubernetes API server (companions that watch the cluster may run)
    wanted: Callable[[Any], bool] = always  # a companion: whether it runs with these options
    check: Callable[[Any], str | None] = no_problem  # what it cannot run without, as the start's error message


def options_of(backend: Backend, settings: object) -> Any:
    """The backend's options, each read from `settings`' attribute of the same name (absent: the default)."""
    values = {f.name: getattr(settings, f.name) for f in fields(backend.options) if hasattr(settings, f.name)}
    return backend.options(**values)
