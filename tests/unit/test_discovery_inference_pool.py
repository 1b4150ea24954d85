"""InferencePool discovery: the pure mapping (pool -> selector and ports, pod -> endpoints and health), and
the real source (the `kubernetes` client's asyncio API) against the local stand-in of the API server: the
pool's pods become endpoints on its target port, a pod that stops being ready or starts terminating leaves
the fleet, a change of the pool's selector or port re-selects, and a failing API server keeps the last
fleet and counts each failure. Plus the settings and the Sidecar's wiring of `--discovery inference-pool`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from loadaware.app import Sidecar
from loadaware.config import ConfigError, from_args, resolve
from loadaware.fleet.discovery.inference_pool import (
    API_CALLS,
    InferencePoolDiscovery,
    InvalidPool,
    PodSet,
    pod_endpoints,
    pod_health,
    pool_spec,
)
from loadaware.fleet.discovery.listwatch import WatchTiming
from testkit.k8s_apiserver import StandInApiServer, make_pod, make_pool
from tests.conftest import wait_until_async
from tests.k8s.crd_schemas import INFERENCE_POOL
from tests.unit.discovery_harness import DiscoveryHarness, on_stand_in_server

VLLM = {"app": "vllm"}


# ---- shapes ---------------------------------------------------------------------------------------------

def test_the_stand_ins_shapes_validate_against_the_real_schemas() -> None:
    for pod in (make_pod("vllm-0", "10.1.0.1", VLLM), make_pod("vllm-1", "", VLLM, phase="Pending"),
                make_pod("vllm-2", "10.1.0.3", VLLM, ready=False, terminating=True)):
        kubernetes_validate.validate({"kind": "Pod", "apiVersion": "v1", **pod}, "1.37.0", strict=True)
    pool = make_pool("vllm", VLLM, [8000, 8001])
    jsonschema.validate({k: v for k, v in pool.items() if k != "status"}, INFERENCE_POOL)


# ---- pure mapping ---------------------------------------------------------------------------------------

def test_pool_spec_takes_the_selector_and_the_target_ports() -> None:
    spec = pool_spec(make_pool("vllm", {"app": "vllm", "tier": "gpu"}, [8000, 8001, 8000]))
    assert spec.label_selector == "app=vllm,tier=gpu"  # sorted: a reordered map is the same pool
    assert spec.ports == (8000, 8001)
    assert spec.selects({"app": "vllm", "tier": "gpu", "pod-template-hash": "x"})
    assert not spec.selects({"app": "vllm"}) and not spec.selects(None)


@pytest.mark.parametrize("spec", [
    None,
    {"selector": {"matchLabels": {}}, "targetPorts": [{"number": 8000}]},  # would select every pod
    {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": []},
    {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": "8000"}]},
    {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 0}]},
    {"targetPorts": [{"number": 8000}]},
])
def test_a_pool_that_selects_nothing_usable_is_refused(spec: Any) -> None:
    with pytest.raises(InvalidPool):
        pool_spec({"metadata": {"name": "vllm"}, "spec": spec})


def test_pod_health_follows_ready_and_deletion() -> None:
    assert pod_health(make_pod("p", "10.0.0.1", VLLM)) == ("HEALTHY", "")
    assert pod_health(make_pod("p", "10.0.0.1", VLLM, ready=False)) == ("UNHEALTHY", "not_ready")
    assert pod_health(make_pod("p", "", VLLM, phase="Pending")) == ("UNHEALTHY", "not_ready")  # no Ready yet
    # still Ready while it drains, but being deleted: no new requests
    assert pod_health(make_pod("p", "10.0.0.1", VLLM, terminating=True)) == ("DRAINING", "terminating")
    assert pod_health(make_pod("p", "10.0.0.1", VLLM, phase="Failed")) == ("UNHEALTHY", "failed")


def test_pod_endpoints_are_ip_and_target_port_with_the_pod_name_as_instance_id() -> None:
    (ep,) = pod_endpoints(make_pod("vllm-0", "10.1.0.1", VLLM), (8000,))
    assert (ep.endpoint, ep.health, ep.instance_id, ep.pod) == ("10.1.0.1:8000", "HEALTHY", "vllm-0", "vllm-0")
    assert pod_endpoints(make_pod("vllm-0", "", VLLM, phase="Pending"), (8000,)) == []  # no address yet
    (v6,) = pod_endpoints(make_pod("vllm-0", "fd00::5", VLLM), (8000,))
    assert v6.endpoint == "[fd00::5]:8000"
    # several target ports: several engines in one pod; the pod name identifies none of them
    two = pod_endpoints(make_pod("vllm-0", "10.1.0.1", VLLM), (8000, 8001))
    assert [(e.endpoint, e.instance_id, e.pod) for e in two] == [("10.1.0.1:8000", "", "vllm-0"),
                                                                ("10.1.0.1:8001", "", "vllm-0")]


def test_pod_set_folds_events_and_drops_pods_relabelled_out() -> None:
    pods = PodSet(pool_spec(make_pool("vllm", VLLM, [8000])))
    pods.replace([make_pod("vllm-0", "10.1.0.1", VLLM), make_pod("other-0", "10.9.0.1", {"app": "other"})])
    assert [e.endpoint for e in pods.endpoints()] == ["10.1.0.1:8000"]
    assert pods.apply("ADDED", make_pod("vllm-1", "10.1.0.2", VLLM))
    assert not pods.apply("BOOKMARK", {"metadata": {"resourceVersion": "9"}})
    assert pods.apply("MODIFIED", make_pod("vllm-0", "10.1.0.1", {"app": "debug"}))  # taken out of the pool
    assert [e.endpoint for e in pods.endpoints()] == ["10.1.0.2:8000"]
    assert pods.apply("DELETED", make_pod("vllm-1", "10.1.0.2", VLLM))
    assert not pods.apply("DELETED", make_pod("vllm-1", "10.1.0.2", VLLM))
    assert len(pods) == 0


# ---- the real source against the stand-in --------------------------------------------------------------

class Harness(DiscoveryHarness[InferencePoolDiscovery]):
    def __init__(self, server: StandInApiServer, tmp_path: Path) -> None:
        super().__init__(server, tmp_path, "inference-pool", lambda catalog, metrics, client: InferencePoolDiscovery(
            "llm", "vllm", catalog, metrics, client, WatchTiming(30, 5.0, (0.05, 0.2), recheck_s=0.05)))

    def pod_requests(self, watch: bool) -> list[dict[str, str]]:
        return [r.params for r in self.server.requests if r.resource == "pods" and r.watch == watch]

    def errors(self) -> float:
        return sum(sample.value for family in self.metrics.errors.collect() for sample in family.samples
                   if sample.name.endswith("_total") and sample.labels["source"] == "inference-pool")

    def endpoints_gauge(self, health: str) -> float:
        return self.metrics.discovered.labels("inference-pool", health)._value.get()


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with on_stand_in_server(lambda server: Harness(server, tmp_path)) as h:
        yield h


async def test_the_pools_pods_become_endpoints_on_its_target_port(harness: Harness) -> None:
    harness.server.set_pool(make_pool("vllm", VLLM, [8000]))
    await harness.server.upsert_pod(make_pod("vllm-0", "10.1.0.1", VLLM))
    await harness.server.upsert_pod(make_pod("vllm-1", "10.1.0.2", VLLM))
    await harness.server.upsert_pod(make_pod("other-0", "10.9.0.1", {"app": "other"}))  # not the pool's
    await harness.server.upsert_pod(make_pod("vllm-2", "", VLLM, phase="Pending"))  # no ip yet
    harness.start()
    await harness.until(lambda: harness.registry.ready, "the first list applied")
    assert harness.registry.snapshot() == ("10.1.0.1:8000", "10.1.0.2:8000")
    assert harness.ids == {"vllm-0": "10.1.0.1:8000", "vllm-1": "10.1.0.2:8000"}
    assert harness.pod_requests(watch=False)[0]["labelSelector"] == "app=vllm"
    await harness.until(lambda: len(harness.pod_requests(watch=True)) == 1, "the pod watch")
    # a new pod, then the pending one gets its ip and turns ready: both join on the one watch
    await harness.server.upsert_pod(make_pod("vllm-3", "10.1.0.4", VLLM))
    await harness.server.upsert_pod(make_pod("vllm-2", "10.1.0.3", VLLM))
    await harness.until(lambda: len(harness.registry.snapshot()) == 4, "the added pods")
    assert harness.ids["vllm-2"] == "10.1.0.3:8000"
    assert harness.endpoints_gauge("HEALTHY") == 4
    assert len(harness.pod_requests(watch=False)) == 1 and len(harness.pod_requests(watch=True)) == 1
    # the source asked only for what the picker's Role grants (tests/k8s checks the Role against API_CALLS)
    asked = {(r.resource, "watch" if r.watch else ("get" if r.resource == "inferencepools" else "list"))
             for r in harness.server.requests}
    assert asked <= {(resource, verb) for _, resource, verbs in API_CALLS for verb in verbs}


async def test_a_pod_turning_not_ready_or_terminating_leaves_the_fleet(harness: Harness) -> None:
    harness.server.set_pool(make_pool("vllm", VLLM, [8000]))
    for i in range(4):
        await harness.server.upsert_pod(make_pod(f"vllm-{i}", f"10.1.0.{i + 1}", VLLM))
    harness.start()
    await harness.until(lambda: len(harness.registry.snapshot()) == 4, "the fleet")
    await harness.until(lambda: len(harness.pod_requests(watch=True)) == 1, "the pod watch")
    # not ready: out at once, its counts released (removal listener), its LMCache credit gone
    await harness.server.upsert_pod(make_pod("vllm-1", "10.1.0.2", VLLM, ready=False))
    await harness.until(lambda: "10.1.0.2:8000" in harness.removed, "the not-ready pod removed")
    assert harness.catalog.entry("10.1.0.2:8000").health == "UNHEALTHY"
    assert "vllm-1" not in harness.ids
    # being deleted (still Ready while it drains): no new requests
    await harness.server.upsert_pod(make_pod("vllm-2", "10.1.0.3", VLLM, terminating=True))
    await harness.until(lambda: "10.1.0.3:8000" in harness.removed, "the terminating pod removed")
    assert (harness.catalog.entry("10.1.0.3:8000").health, harness.catalog.entry("10.1.0.3:8000").detail) == \
        ("DRAINING", "terminating")
    assert harness.endpoints_gauge("DRAINING") == 1 and harness.endpoints_gauge("UNHEALTHY") == 1
    # relabelled out of the pool (the watch sees DELETED), and deleted outright
    await harness.server.upsert_pod(make_pod("vllm-3", "10.1.0.4", {"app": "debug"}))
    await harness.server.delete_pod("vllm-2")
    await harness.until(lambda: "10.1.0.4:8000" in harness.removed, "the relabelled pod removed")
    await harness.until(lambda: harness.registry.snapshot() == ("10.1.0.1:8000",), "one pod left")
    # ready again: back in
    await harness.server.upsert_pod(make_pod("vllm-1", "10.1.0.2", VLLM))
    await harness.until(lambda: harness.registry.snapshot() == ("10.1.0.1:8000", "10.1.0.2:8000"),
                        "the pod ready again")
    assert harness.ids == {"vllm-0": "10.1.0.1:8000", "vllm-1": "10.1.0.2:8000"}


async def test_a_change_of_the_pools_selector_or_port_reselects(harness: Harness) -> None:
    harness.server.set_pool(make_pool("vllm", VLLM, [8000]))
    await harness.server.upsert_pod(make_pod("vllm-0", "10.1.0.1", VLLM))
    await harness.server.upsert_pod(make_pod("vllm-b-0", "10.2.0.1", {"app": "vllm-b"}, port=8100))
    await harness.server.upsert_pod(make_pod("vllm-b-1", "10.2.0.2", {"app": "vllm-b"}, port=8100))
    harness.start()
    await harness.until(lambda: harness.registry.snapshot() == ("10.1.0.1:8000",), "the first pool's pod")
    # the operator points the pool at the new model servers and their port
    harness.server.set_pool(make_pool("vllm", {"app": "vllm-b"}, [8100]))
    await harness.until(lambda: harness.registry.snapshot() == ("10.2.0.1:8100", "10.2.0.2:8100"),
                        "the re-selected pods")
    assert "10.1.0.1:8000" in harness.removed
    assert harness.ids == {"vllm-b-0": "10.2.0.1:8100", "vllm-b-1": "10.2.0.2:8100"}
    assert harness.pod_requests(watch=False)[-1]["labelSelector"] == "app=vllm-b"
    # the new selection is watched: its changes arrive, the old selection's do not
    await harness.until(lambda: bool(harness.pod_requests(watch=True))  # none yet, on a busy machine
                        and harness.pod_requests(watch=True)[-1]["labelSelector"] == "app=vllm-b",
                        "the watch of the new selection")
    await harness.server.upsert_pod(make_pod("vllm-1", "10.1.0.2", VLLM))
    await harness.server.upsert_pod(make_pod("vllm-b-2", "10.2.0.3", {"app": "vllm-b"}, port=8100))
    await harness.until(lambda: len(harness.registry.snapshot()) == 3, "the new selection's new pod")
    assert "10.1.0.2:8000" not in harness.registry.snapshot()
    # only the port changes: the same pods on the new port
    harness.server.set_pool(make_pool("vllm", {"app": "vllm-b"}, [8200]))
    await harness.until(lambda: harness.registry.snapshot() == ("10.2.0.1:8200", "10.2.0.2:8200", "10.2.0.3:8200"),
                        "the new port")
    assert harness.errors() == 0


async def test_the_api_failing_keeps_the_last_fleet_and_counts_the_failure(harness: Harness) -> None:
    harness.server.set_pool(make_pool("vllm", VLLM, [8000]))
    harness.server.pool_failures = 1  # the first read of the pool fails
    harness.server.pod_list_failures = 2  # and so do the first two pod lists
    await harness.server.upsert_pod(make_pod("vllm-0", "10.1.0.1", VLLM))
    harness.start()
    await harness.until(lambda: harness.registry.snapshot() == ("10.1.0.1:8000",), "the fleet after failures")
    assert harness.metrics.errors.labels("inference-pool", "RuntimeError")._value.get() == 3
    assert len(harness.pod_requests(watch=False)) == 3
    # re-reads of the pool fail for a while: the fleet is untouched, every failure counted
    harness.server.pool_failures = 5
    await harness.until(lambda: harness.server.pool_failures == 0, "five failed re-reads")
    await harness.until(lambda: harness.errors() >= 8, "the failed re-reads counted")
    assert harness.registry.snapshot() == ("10.1.0.1:8000",)
    # the pool is deleted: it stays as it was (the gateway's own view of the pool goes with it)
    harness.server.delete_pool("vllm")
    await harness.until(lambda: harness.metrics.errors.labels("inference-pool", "PoolNotFound")._value.get() > 0,
                        "the missing pool counted")
    assert harness.registry.snapshot() == ("10.1.0.1:8000",)
    harness.server.set_pool(make_pool("vllm", VLLM, [8000]))
    # the API server goes away entirely: once the source has failed to reach it, the fleet is as it was
    before = harness.errors()
    await harness.server.stop()
    await harness.until(lambda: harness.errors() > before + 1, "failed attempts to reach the stopped API server")
    assert harness.registry.snapshot() == ("10.1.0.1:8000",)
    assert harness.task is not None and not harness.task.done()  # still trying


async def test_a_pool_missing_at_start_is_waited_for(harness: Harness) -> None:
    await harness.server.upsert_pod(make_pod("vllm-0", "10.1.0.1", VLLM))
    harness.start()
    await harness.until(lambda: harness.metrics.errors.labels("inference-pool", "PoolNotFound")._value.get() >= 2,
                        "the missing pool counted, and retried")
    assert not harness.registry.ready and not harness.pod_requests(watch=False)  # nothing guessed meanwhile
    harness.server.set_pool(make_pool("vllm", VLLM, [8000]))
    await harness.until(lambda: harness.registry.snapshot() == ("10.1.0.1:8000",), "the fleet once the pool exists")


async def test_a_dropped_pod_watch_resumes_and_an_expired_one_relists(harness: Harness) -> None:
    harness.server.set_pool(make_pool("vllm", VLLM, [8000]))
    await harness.server.upsert_pod(make_pod("vllm-0", "10.1.0.1", VLLM))
    harness.start()
    await harness.until(lambda: len(harness.pod_requests(watch=True)) == 1, "the pod watch")
    seen_rv = harness.source.resource_version
    await harness.server.drop_watches()
    await harness.server.upsert_pod(make_pod("vllm-1", "10.1.0.2", VLLM))  # while nobody watches
    await harness.until(lambda: len(harness.registry.snapshot()) == 2, "the change made while nobody watched")
    assert harness.pod_requests(watch=True)[1]["resourceVersion"] == seen_rv
    assert len(harness.pod_requests(watch=False)) == 1
    assert harness.metrics.watch_restarts.labels("resume")._value.get() == 1
    # dropped, changed and compacted in one loop turn: 410 Expired -> a fresh list
    await harness.server.drop_watches()
    await harness.server.delete_pod("vllm-0")
    harness.server.compact()
    await harness.until(lambda: harness.registry.snapshot() == ("10.1.0.2:8000",), "the re-list after 410")
    assert len(harness.pod_requests(watch=False)) == 2


# ---- settings and wiring ---------------------------------------------------------------------------------

def test_settings_name_the_pool_and_refuse_without_it() -> None:
    s = resolve({}, {"LOADAWARE_DISCOVERY": "inference-pool", "LOADAWARE_INFERENCE_POOL": "vllm"})
    assert (s.discovery_mode, s.inference_pool, s.origins["inference_pool"]) == ("inference-pool", "vllm", "env")
    s = from_args(["--discovery", "inference-pool", "--inference-pool", "vllm", "--k8s-namespace", "llm"], environ={})
    assert (s.inference_pool, s.k8s_namespace) == ("vllm", "llm")
    with pytest.raises(ConfigError, match=r"^--inference-pool"):
        from_args(["--discovery", "inference-pool"], environ={})
    with pytest.raises(ConfigError, match=r"^--discovery"):  # the pool finds the endpoints itself
        from_args(["--discovery", "inference-pool", "--inference-pool", "vllm", "--endpoints", "10.0.0.1:8000"],
                  environ={})
    with pytest.raises(ConfigError, match=r"^--inference-pool"):
        from_args(["--discovery", "inference-pool", "--inference-pool", "my pool"], environ={})


async def test_the_sidecar_wires_the_pool_into_its_fleet(tmp_path: Path) -> None:
    server = StandInApiServer(namespace="llm")
    await server.start()
    try:
        server.set_pool(make_pool("vllm", VLLM, [8000]))
        await server.upsert_pod(make_pod("vllm-0", "10.1.0.1", VLLM))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps(server.kubeconfig()))
        sidecar = Sidecar(from_args(["--discovery", "inference-pool", "--inference-pool", "vllm",
                                     "--k8s-namespace", "llm", "--kubeconfig", str(kubeconfig),
                                     "--metrics-listen", "off"], environ={}))
        ((name, run),) = sidecar._discovery_tasks
        assert name == "discovery-inference-pool"
        task = asyncio.create_task(run())
        try:
            await wait_until_async(lambda: sidecar.registry.snapshot() == ("10.1.0.1:8000",),
                                   message="the pool's pod in the sidecar's fleet", interval=0.01)
            assert sidecar.catalog.entry("10.1.0.1:8000").pod == "vllm-0"
            assert sidecar.bridge.explicit == {"vllm-0": "10.1.0.1:8000"}  # the pod name is its LMCache id
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await server.stop()
