"""`static`: the fleet is --endpoints, given to the registry when it is made; nothing runs."""

from __future__ import annotations

from dataclasses import dataclass

from loadaware.fleet.discovery.spec import Backend, DiscoveryContext, Task


@dataclass(frozen=True)
class StaticOptions:
    endpoints_file: str = ""


def _build(options: StaticOptions, context: DiscoveryContext) -> list[tuple[str, Task]]:
    return []


def _check(o: StaticOptions) -> str | None:
    return "--discovery: static takes --endpoints; use --discovery file for --endpoints-file" \
        if o.endpoints_file else None


STATIC = Backend("static", _build, StaticOptions, check=_check)
