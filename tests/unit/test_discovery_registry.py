"""docs/architecture.md, "Adding a discovery backend": a backend registered in BACKENDS is selectable by --discovery,
named in its help, checked at start by its own rule, and built with its options read from the settings; the
InferenceObjective watch runs beside a cluster backend only."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import loadaware.fleet.discovery.registry as registry
from loadaware.config import SETTINGS_BY_NAME, ConfigError, from_args
from loadaware.fleet.discovery.catalog import DiscoveryCatalog
from loadaware.fleet.discovery.metrics import DiscoveryMetrics
from loadaware.fleet.discovery.spec import Backend, DiscoveryContext, Task
from loadaware.fleet.registry import EndpointRegistry
from loadaware.telemetry.metrics import Metrics


@dataclass(frozen=True)
class ConsulOptions:
    envoy_cluster: str = ""  # an existing setting stands in for the backend's own


def build_consul(options: ConsulOptions, context: DiscoveryContext) -> list[tuple[str, Task]]:
    async def run() -> None:
        context.catalog.apply([])

    return [(f"discovery-consul {options.envoy_cluster}", run)]


CONSUL = Backend("consul", build_consul, ConsulOptions, finds_endpoints=True,
                 check=lambda o: None if o.envoy_cluster else "--envoy-cluster: consul needs a service name")


def context() -> DiscoveryContext:
    fleet = EndpointRegistry(())
    return DiscoveryContext(fleet, DiscoveryCatalog("consul", fleet), DiscoveryMetrics(Metrics("x").registry))


def test_a_registered_backend_is_selectable_checked_and_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.BACKENDS, CONSUL.name, CONSUL)
    assert "consul" in SETTINGS_BY_NAME["discovery"].help
    settings = from_args(["--discovery", "consul", "--envoy-cluster", "engines"], environ={})
    assert [name for name, _ in registry.discovery_tasks("consul", settings, context())] == \
        ["discovery-consul engines"]
    with pytest.raises(ConfigError, match="finds the endpoints itself"):
        from_args(["--discovery", "consul", "--endpoints", "10.0.0.1:8000"], environ={})


def test_the_table_keeps_the_modes_and_the_companion_apart() -> None:
    assert registry.modes() == ("static", "file", "envoy-admin", "kubernetes", "inference-pool")
    with pytest.raises(ConfigError, match="--discovery"):
        from_args(["--discovery", "inference-objectives"], environ={})  # a companion is not a mode
    assert registry.in_cluster("kubernetes") and not registry.in_cluster("envoy-admin")
