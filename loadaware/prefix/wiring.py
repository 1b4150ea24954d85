"""Builds the prefix sources `--prefix-source` selects (from prefix/registry.py) and owns their life, so the
app only starts, shows and stops them. It takes plain options, never the configuration object: each source
reads the settings its spec names (prefix/spec.py).

Combination: exact sources are asked together, each endpoint getting the best of their answers; at most one
guess (the sidecar's record) speaks for the endpoints no complete exact source covers (prefix/combined.py).
One source alone is asked directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from loadaware.fleet.registry import FleetListener
from loadaware.lifecycle import LifecycleListener
from loadaware.prefix.combined import CombinedPrefixSource, Member
from loadaware.prefix.counted import SourceLookups
from loadaware.prefix.registry import SOURCES
from loadaware.prefix.source import PrefixSource
from loadaware.prefix.sources.approx import APPROX_TOKEN_BLOCK
from loadaware.prefix.spec import BuildContext, Built, Task, options_of

__all__ = ["APPROX_TOKEN_BLOCK", "PrefixOptions", "PrefixWiring"]

B = TypeVar("B", bound=Built)


@dataclass(frozen=True)
class PrefixOptions:
    """The selection, and where its sources read their options: `settings`, any object with attributes named
    after the settings (the app's Settings); else `values`; else each option's default."""

    names: tuple[str, ...]  # among the registry's
    have_tokenizer: bool = False
    values: Mapping[str, Any] = field(default_factory=dict)
    settings: object | None = None

    def __getattr__(self, name: str) -> Any:
        """A source option by its setting's name (tools read the defaults this way)."""
        if name.startswith("_"):
            raise AttributeError(name)
        if self.settings is not None and hasattr(self.settings, name):
            return getattr(self.settings, name)
        if name in self.values:
            return self.values[name]
        for spec in SOURCES.values():
            for f in fields(spec.options):
                if f.name == name:
                    return getattr(spec.options(), name)
        raise AttributeError(name)


class PrefixWiring:
    def __init__(self, options: PrefixOptions, context: BuildContext) -> None:
        self.names = options.names
        self.parts: dict[str, Built] = {}  # every source built, selected or only configured
        exact: list[Member] = []
        guess: PrefixSource | None = None
        lookups = SourceLookups(context.metrics.registry)  # each source's answers counted apart
        for name, spec in SOURCES.items():
            values = options_of(spec, options)
            if name not in self.names and not spec.configured(values):
                continue
            built = self.parts[name] = spec.build(values, context)
            if name not in self.names:
                continue
            if spec.exact:
                exact.append(Member(lookups.wrap(built.source), built.covered, complete=spec.complete))
            else:
                guess = lookups.wrap(built.source)
        for name, spec in SOURCES.items():
            context.metrics.prefix_source_info.labels(name, "true" if spec.exact else "false").set(
                1 if name in self.names else 0)
        self.source: PrefixSource | None
        if len(exact) == 1 and guess is None:
            self.source = exact[0].source
        elif exact:
            self.source = CombinedPrefixSource(exact, guess)
        else:
            self.source = guess

    @property
    def text_will_do(self) -> bool:
        """Every selected source can be asked with text units (~a token each) when there is no tokenizer."""
        return bool(self.names) and not any(SOURCES[name].needs_tokenizer for name in self.names)

    def part(self, name: str, kind: type[B]) -> B | None:
        """The built source `name` if it was built and is a `kind` (tools and tests reach its internals)."""
        built = self.parts.get(name)
        return built if isinstance(built, kind) else None

    def _selected(self) -> list[Built]:
        return [built for name, built in self.parts.items() if name in self.names]

    def lifecycle_listeners(self) -> list[LifecycleListener]:
        return [b.lifecycle_listener for b in self._selected() if b.lifecycle_listener is not None]

    def fleet_listeners(self) -> list[FleetListener]:
        return [b.fleet_listener for b in self._selected() if b.fleet_listener is not None]

    def tasks(self) -> list[tuple[str, Task]]:
        return [task for built in self.parts.values() for task in built.tasks()]

    def ready(self) -> bool:
        return all(built.ready() for built in self.parts.values())

    def endpoint_removed(self, endpoint: str) -> None:
        for built in self.parts.values():
            built.endpoint_removed(endpoint)

    def endpoints_changed(self, endpoints: tuple[str, ...]) -> None:
        for built in self.parts.values():
            built.endpoints_changed(endpoints)

    def refresh_gauges(self) -> None:
        for built in self.parts.values():
            built.refresh_gauges()

    def state(self) -> dict[str, object]:
        out: dict[str, object] = {"sources": list(self.names)}
        for name, built in self.parts.items():
            shown = built.state()
            if shown is not None:
                out[name.replace("-", "_")] = shown
        return out

    async def close(self) -> None:
        for built in self.parts.values():
            await built.close()
