"""Discovery that is not Kubernetes: the catalog feeding the registry (removal releases counts and
credit), Envoy admin parsing on an answer recorded from a real Envoy 1.40, and the poller against a local
HTTP stand-in of the admin API."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from loadaware.fleet.discovery.catalog import DiscoveredEndpoint, DiscoveryCatalog, merge
from loadaware.fleet.discovery.envoy_admin import ClusterNotFound, EnvoyAdminDiscovery, host_health, parse_cluster_hosts
from loadaware.fleet.discovery.metrics import DiscoveryMetrics
from loadaware.fleet.registry import EndpointRegistry
from loadaware.load.tracker import LoadTracker

RECORDED = json.loads((Path(__file__).parents[1] / "fixtures" / "envoy-admin-clusters.json").read_text())


def test_recorded_envoy_answer_maps_eds_health() -> None:
    hosts = parse_cluster_hosts(RECORDED, "engines")
    assert [(h.endpoint, h.health, h.routable) for h in hosts] == [
        ("127.0.0.2:8000", "HEALTHY", True),
        ("127.0.0.3:8000", "UNHEALTHY", False),
        ("127.0.0.4:8000", "DRAINING", False),
        ("127.0.0.5:8000", "DEGRADED", True),
    ]
    assert hosts[1].detail == "eds_health_status=UNHEALTHY"


def test_unknown_cluster_is_an_error_not_an_empty_fleet() -> None:
    try:
        parse_cluster_hosts(RECORDED, "outbound|8000||vllm.llm.svc.cluster.local")
    except ClusterNotFound as exc:
        assert "engines" in str(exc)  # the message lists what Envoy does have
    else:
        raise AssertionError("expected ClusterNotFound")


def test_health_flags() -> None:
    assert host_health({}) == ("HEALTHY", "")
    assert host_health({"eds_health_status": "UNKNOWN"}) == ("HEALTHY", "")
    assert host_health({"failed_active_health_check": True, "eds_health_status": "HEALTHY"}) == \
        ("UNHEALTHY", "failed_active_health_check")
    assert host_health({"failed_outlier_check": True}) == ("UNHEALTHY", "failed_outlier_check")
    assert host_health({"pending_dynamic_removal": True, "failed_outlier_check": True})[0] == "DRAINING"
    assert host_health({"failed_active_degraded_check": True}) == ("DEGRADED", "failed_active_degraded_check")
    assert host_health({"eds_health_status": "TIMEOUT"})[0] == "UNHEALTHY"


def test_ipv6_and_pipe_hosts() -> None:
    answer = {"cluster_statuses": [{"name": "engines", "host_statuses": [
        {"address": {"socket_address": {"address": "fd00::7", "port_value": 8000}}},
        {"address": {"socket_address": {"address": "FD00:0:0:0:0:0:0:8", "port_value": 8000}}},
        {"address": {"socket_address": {"address": "", "port_value": 8000}}},  # names nothing: dropped
        {"address": {"pipe": {"path": "/tmp/sock"}}},
    ]}]}
    assert [h.endpoint for h in parse_cluster_hosts(answer, "engines")] == ["[fd00::7]:8000", "[fd00::8]:8000"]


def test_merge_prefers_the_routable_report() -> None:
    merged = merge([DiscoveredEndpoint("a:1", "DRAINING"), DiscoveredEndpoint("b:1"),
                    DiscoveredEndpoint("a:1", "HEALTHY", instance_id="pod-a")])
    assert [(m.endpoint, m.health, m.instance_id) for m in merged] == \
        [("a:1", "HEALTHY", "pod-a"), ("b:1", "HEALTHY", "")]


def test_catalog_removal_releases_counts_and_instance_ids() -> None:
    registry = EndpointRegistry()
    inflight = LoadTracker(stale_s=5.0)
    registry.on_removed(inflight.drop)
    ids: list[dict[str, str]] = []
    catalog = DiscoveryCatalog("kubernetes", registry, on_instance_ids=lambda m: ids.append(dict(m)))
    assert not registry.ready
    catalog.apply([DiscoveredEndpoint("10.0.0.1:8000", instance_id="vllm-0"),
                   DiscoveredEndpoint("10.0.0.2:8000", instance_id="vllm-1"),
                   DiscoveredEndpoint("10.0.0.3:8000", "UNHEALTHY", "not_ready", instance_id="vllm-2")])
    assert registry.ready and registry.snapshot() == ("10.0.0.1:8000", "10.0.0.2:8000")
    assert ids[-1] == {"vllm-0": "10.0.0.1:8000", "vllm-1": "10.0.0.2:8000"}
    lease = inflight.acquire("10.0.0.2:8000")
    assert inflight.count("10.0.0.2:8000") == 1
    catalog.apply([DiscoveredEndpoint("10.0.0.1:8000", instance_id="vllm-0"),
                   DiscoveredEndpoint("10.0.0.2:8000", "DRAINING", "terminating", instance_id="vllm-1")])
    assert registry.snapshot() == ("10.0.0.1:8000",)
    assert inflight.count("10.0.0.2:8000") == 0  # released at once
    inflight.release(lease)  # the stream ending later is a no-op
    assert inflight.total() == 0
    assert ids[-1] == {"vllm-0": "10.0.0.1:8000"}  # its LMCache credit ends
    listed = catalog.entries()
    assert [(e.endpoint, e.health) for e in listed] == [("10.0.0.1:8000", "HEALTHY"), ("10.0.0.2:8000", "DRAINING")]
    # an empty report is a real answer (the Service scaled to zero): ready, empty fleet
    catalog.apply([])
    assert registry.snapshot() == () and registry.ready


class FakeAdmin:
    def __init__(self) -> None:
        self.answer: Any = RECORDED
        self.status = 200
        self.delay = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        assert request.query.get("format") == "json"
        await asyncio.sleep(self.delay)
        return web.json_response(self.answer, status=self.status)


async def test_envoy_poller_applies_and_keeps_the_last_set_on_failure() -> None:
    admin = FakeAdmin()
    app = web.Application()
    app.router.add_get("/clusters", admin.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    registry = EndpointRegistry()
    metrics = DiscoveryMetrics(CollectorRegistry())
    source = EnvoyAdminDiscovery(f"http://127.0.0.1:{port}", "engines", DiscoveryCatalog("envoy-admin", registry),
                                 metrics, interval_s=0.05, timeout_s=0.2)
    try:
        async with aiohttp.ClientSession() as session:
            assert await source.poll_once(session)
            assert registry.snapshot() == ("127.0.0.2:8000", "127.0.0.5:8000")
            admin.status = 503
            assert not await source.poll_once(session)
            admin.status, admin.delay = 200, 0.5
            assert not await source.poll_once(session)
            admin.delay = 0.0
            admin.answer = {"cluster_statuses": [{"name": "other"}]}
            assert not await source.poll_once(session)
            assert registry.snapshot() == ("127.0.0.2:8000", "127.0.0.5:8000")  # kept through all three
            assert metrics.errors.labels("envoy-admin", "timeout")._value.get() == 1
            assert metrics.errors.labels("envoy-admin", "cluster_not_found")._value.get() == 1
            admin.answer = {"cluster_statuses": [{"name": "engines", "host_statuses": []}]}
            assert await source.poll_once(session)
            assert registry.snapshot() == ()
    finally:
        await runner.cleanup()
