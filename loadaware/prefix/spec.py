"""What a prefix source declares so that `--prefix-source` can select it: one `SourceSpec` in its own module
(loadaware/prefix/sources/), listed once in loadaware/prefix/registry.py. The wiring (prefix/wiring.py), the
flag's parser and help, `auto` and the combination rules read these declarations; nothing else names a source.

A source reads plain option values, never the configuration object: its `options` is a frozen dataclass whose
fields are named after the settings it reads (config.py's table), and `options_of` fills it from anything with
those attributes (the app's Settings; a test's namespace). A field the object lacks keeps its default.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, fields
from typing import Any

from loadaware.fleet.registry import FleetListener
from loadaware.lifecycle import LifecycleListener
from loadaware.prefix.kvevents.feeds import Spawn
from loadaware.prefix.lmcache.bridge import InstanceBridge
from loadaware.prefix.source import PrefixSource
from loadaware.telemetry.metrics import Metrics

Task = Callable[[], Coroutine[Any, Any, None]]
Covered = Callable[[Sequence[str]], set[str]]


@dataclass(frozen=True)
class NoOptions:
    """A source that reads no setting."""


@dataclass(frozen=True)
class BuildContext:
    """What every source may use when it is built: shared objects of the sidecar, never its settings."""

    metrics: Metrics
    endpoints: Callable[[], tuple[str, ...]]  # the fleet now
    # LMCache instance id -> endpoint: the app keeps it (discovery feeds it pod names, the API shows it).
    bridge: InstanceBridge
    spawn: Spawn | None = None  # the supervisor's, for tasks that come and go with the fleet


class Built:
    """A built source: what it answers, and its life in the sidecar. Every hook but the source is optional; the
    defaults here do nothing, so a source overrides only what it has."""

    def __init__(self, source: PrefixSource, covered: Covered | None = None) -> None:
        self.source = source
        # The endpoints it speaks for (used when its spec is `complete`: a guess never overrides it there).
        self.covered: Covered = covered or set
        self.lifecycle_listener: LifecycleListener | None = None  # hears decided / served / ended
        self.fleet_listener: FleetListener | None = None  # hears added / removed / changed

    def tasks(self) -> list[tuple[str, Task]]:
        """Background work, run under the supervisor: (task name, coroutine function)."""
        return []

    def state(self) -> dict[str, object] | None:
        """Its part of /debug/state's `prefix` (None: nothing to show)."""
        return None

    def refresh_gauges(self) -> None:
        """Set its gauges just before /metrics renders."""

    def endpoint_removed(self, endpoint: str) -> None:
        """An endpoint left the fleet: forget what it held."""

    def endpoints_changed(self, endpoints: tuple[str, ...]) -> None:
        """The fleet changed (after each added / removed)."""

    def ready(self) -> bool:
        """Whether the sidecar may take traffic as far as this source is concerned."""
        return True

    async def close(self) -> None:
        """Release sockets and sessions at shutdown."""


def never(options: Any) -> bool:
    return False


def no_problem(options: Any, selected: bool) -> str | None:
    return None


@dataclass(frozen=True)
class SourceSpec:
    """One prefix source as `--prefix-source` knows it."""

    name: str  # the flag's word
    build: Callable[[Any, BuildContext], Built]  # (its options, the context) -> the built source
    options: type[Any] = NoOptions  # fields named after the settings it reads
    exact: bool = True  # credits what the engines report they hold; False: a guess (one guess per selection)
    complete: bool = True  # names every holder of what it credits; False: one holder per chunk (LMCache)
    needs_tokenizer: bool = True  # asked by token ids; False: text units of ~a token each will do
    # `auto` selects it when this says so of its options (and a tokenizer is configured, if it needs one).
    default: Callable[[Any], bool] = never
    auto_help: str = ""  # when `auto` selects it, in words for --help ("" = never)
    # Built, its background work running, even when not selected (LMCache: the instance map the API shows).
    configured: Callable[[Any], bool] = never
    # A configuration it cannot run with, as the start's error message (selected: whether it is in the selection).
    check: Callable[[Any, bool], str | None] = no_problem
    title: str = ""  # how prose names it ("LMCache"); default: its name
    why_default: str = ""  # why `auto` adds the sidecar's record beside it (an incomplete exact source)


def options_of(spec: SourceSpec, settings: object) -> Any:
    """The spec's options, each read from `settings`' attribute of the same name (absent: the default)."""
    values = {f.name: getattr(settings, f.name) for f in fields(spec.options) if hasattr(settings, f.name)}
    return spec.options(**values)
