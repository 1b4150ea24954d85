"""Kubernetes EndpointSlice discovery: the pure mapping on recorded API shapes, and the real source (the
`kubernetes` client's asyncio API) against a local stand-in of the API server's list/watch, including a
dropped watch that resumes from its resourceVersion and a 410 that re-lists."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from loadaware.fleet.discovery.kubernetes import (
    KubernetesDiscovery,
    ServiceRef,
    SliceSet,
    endpoint_health,
    slice_endpoints,
)
from loadaware.fleet.discovery.listwatch import WatchTiming
from loadaware.fleet.discovery.metrics import DiscoveryMetrics
from testkit.k8s_apiserver import PodEndpoint, StandInApiServer, make_slice, recorded_events, recorded_list
from tests.unit.discovery_harness import DiscoveryHarness, on_stand_in_server

# ---- recorded shapes ----------------------------------------------------------------------------------

def test_recorded_shapes_validate_against_the_kubernetes_schema() -> None:
    for item in recorded_list()["items"]:
        kubernetes_validate.validate({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", **item},
                                     "1.37.0", strict=True)
    for event in recorded_events():
        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
            kubernetes_validate.validate(event["object"], "1.37.0", strict=True)
    made = make_slice("s", "svc", "ns", [PodEndpoint("10.0.0.1", "p")], 8000)
    kubernetes_validate.validate({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", **made}, "1.37.0",
                                 strict=True)


def test_recorded_list_maps_pods_to_endpoints_health_and_instance_ids() -> None:
    eps = slice_endpoints(recorded_list()["items"][0], "http")
    assert [(e.endpoint, e.health, e.detail, e.instance_id, e.zone) for e in eps] == [
        ("10.244.1.17:8000", "HEALTHY", "", "vllm-0", "us-east-1a"),
        ("10.244.2.9:8000", "UNHEALTHY", "not_ready", "vllm-1", "us-east-1b"),
        ("10.244.3.4:8000", "DRAINING", "terminating", "vllm-2", "us-east-1a"),
    ]
    # the named port picks the right one; a missing name gives nothing rather than a wrong port
    assert slice_endpoints(recorded_list()["items"][0], "lmcache")[0].endpoint == "10.244.1.17:8100"
    assert slice_endpoints(recorded_list()["items"][0], "grpc") == []
    assert slice_endpoints(recorded_list()["items"][0], "")[0].endpoint == "10.244.1.17:8000"


def test_conditions_follow_the_api_defaults() -> None:
    assert endpoint_health(None) == ("HEALTHY", "")  # nil ready means ready
    assert endpoint_health({"ready": None}) == ("HEALTHY", "")
    assert endpoint_health({"ready": False}) == ("UNHEALTHY", "not_ready")
    assert endpoint_health({"ready": True, "terminating": True}) == ("DRAINING", "terminating")


def test_ipv6_and_fqdn_slices() -> None:
    v6 = {"addressType": "IPv6", "endpoints": [{"addresses": ["fd00::5"], "conditions": {"ready": True}}],
          "ports": [{"name": "http", "port": 8000}]}
    assert slice_endpoints(v6, "http")[0].endpoint == "[fd00::5]:8000"
    expanded = {**v6, "endpoints": [{"addresses": ["FD00:0:0:0:0:0:0:6", "not an address"]}]}
    assert [e.endpoint for e in slice_endpoints(expanded, "http")] == ["[fd00::6]:8000"]
    assert slice_endpoints({**v6, "addressType": "FQDN"}, "http") == []


def test_recorded_watch_events_fold_into_the_set() -> None:
    slices = SliceSet("http")
    slices.replace(recorded_list()["items"])
    modified, bookmark, _error = recorded_events()
    assert slices.apply(modified["type"], modified["object"])
    assert [e.endpoint for e in slices.endpoints() if e.routable] == ["10.244.1.17:8000", "10.244.2.9:8000"]
    assert not slices.apply(bookmark["type"], bookmark["object"])
    assert slices.apply("DELETED", modified["object"])
    assert slices.endpoints() == []


# ---- the real source against the stand-in --------------------------------------------------------------

class Harness(DiscoveryHarness[KubernetesDiscovery]):
    def __init__(self, server: StandInApiServer, tmp_path: Path) -> None:
        super().__init__(server, tmp_path, "kubernetes", lambda catalog, metrics, client: KubernetesDiscovery(
            ServiceRef("llm", "vllm", "http"), catalog, metrics, client, WatchTiming(30, backoff_s=(0.05, 0.2))))

    def watches(self) -> list[dict[str, str]]:
        return [r.params for r in self.server.requests if r.watch]

    def lists(self) -> int:
        return sum(not r.watch for r in self.server.requests)


def discovery_errors(metrics: DiscoveryMetrics) -> float:
    """Every failure the Kubernetes source counted, whatever its reason label."""
    return sum(sample.value for family in metrics.errors.collect() for sample in family.samples
               if sample.name.endswith("_total") and sample.labels["source"] == "kubernetes")


def slice_of(*pods: tuple[str, str], name: str = "vllm-aaaaa", ready: bool = True) -> dict[str, Any]:
    return make_slice(name, "vllm", "llm", [PodEndpoint(ip, pod, ready=ready) for ip, pod in pods], 8000)


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with on_stand_in_server(lambda server: Harness(server, tmp_path)) as h:
        yield h


async def test_list_then_watch_follows_changes_and_maps_pod_names(harness: Harness) -> None:
    await harness.server.upsert(slice_of(("10.1.0.1", "vllm-0"), ("10.1.0.2", "vllm-1")))
    # an unrelated Service's slice is not ours
    other = make_slice("other-xyz", "other", "llm", [PodEndpoint("10.9.9.9", "other-0")], 8000)
    await harness.server.upsert(other)
    assert not harness.registry.ready
    harness.start()
    await harness.until(lambda: harness.registry.ready, "the first list applied")
    assert harness.registry.snapshot() == ("10.1.0.1:8000", "10.1.0.2:8000")
    assert harness.ids == {"vllm-0": "10.1.0.1:8000", "vllm-1": "10.1.0.2:8000"}
    assert "labelSelector" in harness.server.requests[0].params
    assert harness.server.requests[0].params["labelSelector"] == "kubernetes.io/service-name=vllm"
    await harness.until(lambda: len(harness.watches()) == 1, "the first watch")
    # scale up in a second slice
    await harness.server.upsert(slice_of(("10.1.0.3", "vllm-2"), name="vllm-bbbbb"))
    await harness.until(lambda: len(harness.registry.snapshot()) == 3, "the second slice's pod added")
    assert harness.ids["vllm-2"] == "10.1.0.3:8000"
    # a pod goes not-ready: out of the fleet at once, its counts released, its credit gone
    await harness.server.upsert(slice_of(("10.1.0.3", "vllm-2"), name="vllm-bbbbb", ready=False))
    await harness.until(lambda: "10.1.0.3:8000" in harness.removed, "the not-ready pod removed")
    assert "vllm-2" not in harness.ids
    assert harness.catalog.entry("10.1.0.3:8000").health == "UNHEALTHY"
    # the slice is deleted
    await harness.server.delete("vllm-aaaaa")
    await harness.until(lambda: harness.registry.snapshot() == (), "the deleted slice's pods removed")
    assert set(harness.removed) == {"10.1.0.1:8000", "10.1.0.2:8000", "10.1.0.3:8000"}
    assert harness.lists() == 1 and len(harness.watches()) == 1  # all of it on one watch


async def test_dropped_watch_resumes_from_the_last_resource_version(harness: Harness) -> None:
    await harness.server.upsert(slice_of(("10.1.0.1", "vllm-0")))
    harness.start()
    await harness.until(lambda: len(harness.watches()) == 1, "the first watch")
    await harness.server.upsert(slice_of(("10.1.0.1", "vllm-0"), ("10.1.0.2", "vllm-1")))
    await harness.until(lambda: len(harness.registry.snapshot()) == 2, "the added pod seen")
    seen_rv = harness.source.resource_version
    assert seen_rv is not None
    await harness.server.drop_watches()
    # a change while nobody watches is delivered by the resumed watch, with no new list
    await harness.server.upsert(slice_of(("10.1.0.2", "vllm-1")))
    await harness.until(lambda: harness.registry.snapshot() == ("10.1.0.2:8000",),
                        "the change made while nobody watched")
    watches = harness.watches()
    assert len(watches) == 2
    assert watches[1]["resourceVersion"] == seen_rv
    assert watches[1]["allowWatchBookmarks"] == "true"
    assert harness.lists() == 1
    assert harness.metrics.watch_restarts.labels("resume")._value.get() == 1


async def test_expired_resource_version_relists(harness: Harness) -> None:
    await harness.server.upsert(slice_of(("10.1.0.1", "vllm-0")))
    harness.start()
    await harness.until(lambda: len(harness.watches()) == 1, "the first watch")
    # In one loop turn (the client cannot reconnect in between): the watch drops, the slice changes and
    # history is compacted past the resourceVersion the client holds.
    await harness.server.drop_watches()
    await harness.server.upsert(slice_of(("10.1.0.5", "vllm-5")))
    harness.server.compact()
    await harness.until(lambda: harness.registry.snapshot() == ("10.1.0.5:8000",), "the re-list after 410")
    assert harness.lists() == 2  # 410 Expired -> a fresh list
    assert harness.ids == {"vllm-5": "10.1.0.5:8000"}


async def test_bookmarks_advance_the_resource_version(harness: Harness) -> None:
    await harness.server.upsert(slice_of(("10.1.0.1", "vllm-0")))
    harness.start()
    await harness.until(lambda: len(harness.watches()) == 1, "the first watch")
    before = harness.source.resource_version
    await harness.server.bookmark()
    await harness.until(lambda: harness.source.resource_version != before, "the bookmark's resourceVersion")
    await harness.server.drop_watches()
    await harness.until(lambda: len(harness.watches()) == 2, "the resumed watch")
    assert int(harness.watches()[1]["resourceVersion"]) > int(before or 0)


async def test_api_server_errors_keep_the_last_set_and_retry(harness: Harness) -> None:
    harness.server.list_failures = 2
    await harness.server.upsert(slice_of(("10.1.0.1", "vllm-0")))
    harness.start()
    await harness.until(lambda: harness.registry.snapshot() == ("10.1.0.1:8000",), "the list after two failures")
    assert harness.lists() == 3
    assert harness.metrics.errors.labels("kubernetes", "RuntimeError")._value.get() == 2
    # the API server goes away entirely: once the source has failed to reach it, the fleet is as it was
    failures_before = discovery_errors(harness.metrics)
    await harness.server.stop()
    await harness.until(lambda: discovery_errors(harness.metrics) > failures_before,
                        "a failed attempt to reach the stopped API server")
    assert harness.registry.snapshot() == ("10.1.0.1:8000",)
