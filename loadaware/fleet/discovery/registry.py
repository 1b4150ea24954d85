"""Every discovery backend: one line each. `--discovery` selects one mode; companions (mode=False) run beside
it when their options say so. The flag's parser and help, the start's checks and the app read this table
(docs/architecture.md, "Adding a discovery backend")."""

from __future__ import annotations

from loadaware.fleet.discovery.backends.envoy_admin import ENVOY_ADMIN
from loadaware.fleet.discovery.backends.file import FILE
from loadaware.fleet.discovery.backends.inference_pool import INFERENCE_POOL
from loadaware.fleet.discovery.backends.kubernetes import KUBERNETES
from loadaware.fleet.discovery.backends.objectives import OBJECTIVES
from loadaware.fleet.discovery.backends.static import STATIC
from loadaware.fleet.discovery.spec import Backend, DiscoveryContext, Task, options_of

BACKENDS: dict[str, Backend] = {backend.name: backend for backend in (
    STATIC,
    FILE,
    ENVOY_ADMIN,
    KUBERNETES,
    INFERENCE_POOL,
    OBJECTIVES,
)}


def modes() -> tuple[str, ...]:
    """The words --discovery accepts, in the table's order."""
    return tuple(name for name, backend in BACKENDS.items() if backend.mode)


def discovery_help() -> str:
    return f"{' | '.join(modes())} (default: file with --endpoints-file, else static)"


def discovery_problem(mode: str, settings: object) -> str | None:
    """Why `mode` cannot run with these settings (None: it can)."""
    backend = BACKENDS[mode]
    if backend.finds_endpoints and (getattr(settings, "endpoints", None) or getattr(settings, "endpoints_file", "")):
        return f"--discovery: {mode} finds the endpoints itself; drop --endpoints / --endpoints-file"
    return backend.check(options_of(backend, settings))


def discovery_tasks(mode: str, settings: object, context: DiscoveryContext) -> list[tuple[str, Task]]:
    """Build the selected mode and every companion that is wanted; their background tasks, in table order."""
    tasks = BACKENDS[mode].build(options_of(BACKENDS[mode], settings), context)
    for backend in BACKENDS.values():
        if not backend.mode:
            options = options_of(backend, settings)
            if backend.wanted(options):
                tasks += backend.build(options, context)
    return tasks


def in_cluster(mode: str) -> bool:
    """Whether `mode` follows a Kubernetes API server."""
    backend = BACKENDS.get(mode)
    return backend is not None and backend.in_cluster
