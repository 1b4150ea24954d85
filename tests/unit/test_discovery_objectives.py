"""InferenceObjective discovery: the fold (an objective of this pool gives its priority, 0 when unset; another
pool's does not; an invalid one is skipped and reported; a bound on how many; a deleted one's priority goes),
and the real watch (the `kubernetes` client's asyncio API, CustomObjectsApi) against the local stand-in of the
API server, feeding a real `Objectives`: priorities listed at start, then changed by watch events, and no CRD
(404) keeps the file's priorities. Plus the setting and the Sidecar's wiring."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prometheus_client import CollectorRegistry

from loadaware.admission import objectives as admission_objectives
from loadaware.admission.objectives import Objectives
from loadaware.app import Sidecar
from loadaware.config import from_args, resolve
from loadaware.fleet.discovery import objectives as discovery_objectives
from loadaware.fleet.discovery.kubernetes import make_api_client
from loadaware.fleet.discovery.listwatch import WatchTiming
from loadaware.fleet.discovery.metrics import DiscoveryMetrics
from loadaware.fleet.discovery.objectives import (
    API_CALLS,
    InferenceObjectivesWatch,
    ObjectiveSet,
    Skipped,
    objective_priority,
)
from loadaware.runtime.readiness import is_required
from testkit.k8s_apiserver import OBJECTIVES, StandInApiServer, make_objective
from tests.conftest import wait_until_async
from tests.k8s.crd_schemas import INFERENCE_OBJECTIVE

# ---- shapes and bounds ----------------------------------------------------------------------------------

def test_the_stand_ins_objective_validates_against_the_crds_schema() -> None:
    for objective in (make_objective("critical", 10), make_objective("standard", None),
                      make_objective("batch", -1, pool_group="inference.networking.k8s.io", pool_kind="InferencePool")):
        jsonschema.validate({k: v for k, v in objective.items() if k != "status"}, INFERENCE_OBJECTIVE)


def test_the_bounds_are_the_objectives_files() -> None:
    # fleet/ may not import admission/: the bounds are restated there, and must agree
    assert discovery_objectives.DEFAULT_PRIORITY == admission_objectives.DEFAULT_PRIORITY
    assert discovery_objectives.MAX_OBJECTIVES == admission_objectives.MAX_OBJECTIVES
    assert discovery_objectives.PRIORITY_RANGE == admission_objectives.PRIORITY_RANGE


# ---- the fold -------------------------------------------------------------------------------------------

def test_an_objective_of_the_pool_gives_its_priority_and_unset_is_zero() -> None:
    assert objective_priority(make_objective("critical", 10), "vllm") == ("critical", 10)
    assert objective_priority(make_objective("batch", -1), "vllm") == ("batch", -1)
    assert objective_priority(make_objective("standard", None), "vllm") == ("standard", 0)
    explicit = make_objective("x", 3, pool_group="inference.networking.k8s.io", pool_kind="InferencePool")
    assert objective_priority(explicit, "vllm") == ("x", 3)


def test_only_the_pools_own_objectives_count_unless_no_pool_is_named() -> None:
    other_pool = make_objective("other", 5, pool="vllm-b")
    other_group = make_objective("old", 5, pool_group="inference.networking.x-k8s.io")  # the v1alpha2 pool
    other_kind = make_objective("svc", 5, pool_kind="Service")
    no_ref = {"metadata": {"name": "loose"}, "spec": {"priority": 5}}
    for objective in (other_pool, other_group, other_kind, no_ref):
        assert objective_priority(objective, "vllm") is None
    # a sidecar with no pool name (EndpointSlice discovery): every objective of the namespace
    assert [objective_priority(o, "") for o in (other_pool, other_group, other_kind, no_ref)] == [
        ("other", 5), ("old", 5), ("svc", 5), ("loose", 5)]


@pytest.mark.parametrize(("priority", "why"), [
    (True, "not an integer"), ("10", "not an integer"), (1.5, "not an integer"),
    (1_000_001, "not an integer in"), (-1_000_001, "not an integer in"), (2**63, "not an integer in"),
])
def test_an_invalid_priority_is_skipped(priority: Any, why: str) -> None:
    found = objective_priority(make_objective("bad", priority), "vllm")
    assert isinstance(found, Skipped) and found.name == "bad" and why in found.reason
    assert objective_priority(make_objective("edge", 1_000_000), "vllm") == ("edge", 1_000_000)
    assert objective_priority(make_objective("edge", -1_000_000), "vllm") == ("edge", -1_000_000)


def test_a_name_no_request_header_can_carry_is_skipped() -> None:
    long = "a" * 129
    found = objective_priority(make_objective(long, 1), "vllm")
    assert isinstance(found, Skipped) and "128" in found.reason
    assert objective_priority(make_objective("a" * 128, 1), "vllm") == ("a" * 128, 1)
    nameless = objective_priority({"metadata": {}, "spec": {"poolRef": {"name": "vllm"}, "priority": 1}}, "vllm")
    assert isinstance(nameless, Skipped)


def test_the_set_folds_a_list_and_events_and_a_deletion_removes_the_priority() -> None:
    folded = ObjectiveSet("vllm")
    folded.replace([make_objective("critical", 10), make_objective("standard", None),
                    make_objective("batch", -1), make_objective("elsewhere", 7, pool="vllm-b"),
                    make_objective("bad", "high")])
    assert folded.priorities() == {"critical": 10, "standard": 0, "batch": -1}
    assert folded.skipped == [Skipped("bad", folded.skipped[0].reason)]
    assert folded.apply("MODIFIED", make_objective("critical", 20))
    assert not folded.apply("MODIFIED", make_objective("critical", 20))  # a status update: nothing changed
    assert not folded.skipped
    assert folded.apply("ADDED", make_objective("interactive", 5))
    assert not folded.apply("BOOKMARK", {"metadata": {"resourceVersion": "9"}})
    assert folded.apply("DELETED", make_objective("batch", -1))
    assert not folded.apply("DELETED", make_objective("batch", -1))  # gone already
    assert folded.apply("MODIFIED", make_objective("standard", 0, pool="vllm-b"))  # moved to another pool
    assert not folded.apply("ADDED", make_objective("elsewhere-2", 1, pool="vllm-b"))
    # made invalid: its priority goes (the file's or the default applies), and it is reported
    assert folded.apply("MODIFIED", make_objective("interactive", 10**9))
    assert [s.name for s in folded.skipped] == ["interactive"]
    assert folded.priorities() == {"critical": 20}
    objectives = Objectives({"batch": -5, "critical": 1})
    objectives.set_cluster(folded.priorities())  # what the watch hands over: the cluster's over the file's
    assert (objectives.priority("critical"), objectives.priority("batch"), objectives.priority("x")) == (20, -5, 0)


def test_the_set_is_bounded() -> None:
    folded = ObjectiveSet("vllm", limit=3)
    folded.replace([make_objective(f"o{i}", i) for i in (4, 3, 2, 1, 0)])
    assert folded.priorities() == {"o0": 0, "o1": 1, "o2": 2}  # by name, whatever the list's order
    assert sorted(s.name for s in folded.skipped) == ["o3", "o4"]
    assert folded.apply("ADDED", make_objective("o5", 5))  # reported, not taken
    assert [s.name for s in folded.skipped] == ["o5"] and len(folded) == 3
    assert folded.apply("MODIFIED", make_objective("o1", 11))  # a known one still changes
    assert folded.apply("DELETED", make_objective("o0", 0))
    assert folded.apply("ADDED", make_objective("o5", 5)) and folded.priorities() == {"o1": 11, "o2": 2, "o5": 5}
    assert ObjectiveSet("vllm").limit == 10_000


# ---- the real watch against the stand-in ----------------------------------------------------------------

class Harness:
    def __init__(self, server: StandInApiServer, tmp_path: Path, pool: str = "vllm",
                 from_file: dict[str, int] | None = None) -> None:
        self.server = server
        self.objectives = Objectives(from_file)
        self.changes = 0
        self.metrics = DiscoveryMetrics(CollectorRegistry())
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps(server.kubeconfig()))
        self.watch = InferenceObjectivesWatch("llm", pool, self._changed, self.metrics,
                                              lambda: make_api_client(str(kubeconfig)),
                                              WatchTiming(30, 5.0, (0.05, 0.2), recheck_s=0.2))
        self.task: asyncio.Task[None] | None = None

    def _changed(self, priorities: dict[str, int]) -> None:
        self.changes += 1
        self.objectives.set_cluster(priorities)

    def start(self) -> None:
        self.task = asyncio.create_task(self.watch.run())

    def requests(self, watch: bool) -> list[dict[str, str]]:
        return [r.params for r in self.server.requests if r.resource == OBJECTIVES and r.watch == watch]

    def errors(self, reason: str | None = None) -> float:
        return sum(sample.value for family in self.metrics.errors.collect() for sample in family.samples
                   if sample.name.endswith("_total") and sample.labels["source"] == "inference-objectives"
                   and reason in (None, sample.labels["reason"]))

    async def until(self, cond: Any, what: str) -> None:
        await wait_until_async(cond, message=what, interval=0.01)


@pytest.fixture
async def server() -> AsyncIterator[StandInApiServer]:
    server = StandInApiServer(namespace="llm")
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def harness(server: StandInApiServer, tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(server, tmp_path, from_file={"batch": -5, "legacy": 3})
    yield h
    if h.task is not None:
        h.task.cancel()
        await asyncio.gather(h.task, return_exceptions=True)


async def test_listed_objectives_reach_the_priorities_and_events_change_them(harness: Harness) -> None:
    server, objectives = harness.server, harness.objectives
    await server.upsert_objective(make_objective("critical", 10))
    await server.upsert_objective(make_objective("standard", None))
    await server.upsert_objective(make_objective("batch", -1))
    await server.upsert_objective(make_objective("elsewhere", 7, pool="vllm-b"))  # another pool's
    harness.start()
    await harness.until(lambda: objectives.priority("critical") == 10, "the listed objectives")
    assert objectives.known() == {"critical": 10, "standard": 0, "batch": -1, "legacy": 3}  # over the file's
    assert objectives.priority("elsewhere") == 0 and objectives.top() == 10
    assert len(harness.requests(watch=False)) == 1
    await harness.until(lambda: len(harness.requests(watch=True)) == 1, "the watch")
    # ADDED, MODIFIED, DELETED on the one watch, resumed from the list's resourceVersion
    await server.upsert_objective(make_objective("interactive", 5))
    await harness.until(lambda: objectives.priority("interactive") == 5, "an added objective")
    await server.upsert_objective(make_objective("critical", 20))
    await harness.until(lambda: objectives.priority("critical") == 20, "a modified priority")
    await server.delete_objective("batch")
    await harness.until(lambda: objectives.priority("batch") == -5, "a deleted objective: the file's again")
    await server.upsert_objective(make_objective("interactive", 5, pool="vllm-b"))
    await harness.until(lambda: objectives.priority("interactive") == 0, "an objective moved to another pool")
    changes = harness.changes
    await server.upsert_objective(make_objective("elsewhere", 8, pool="vllm-b"))  # not ours: nothing handed over
    await server.upsert_objective(make_objective("invalid", 10**7))
    await harness.until(lambda: harness.errors("invalid_objective") == 1, "the invalid objective counted")
    assert objectives.known() == {"critical": 20, "standard": 0, "batch": -5, "legacy": 3}
    assert harness.changes == changes + 1  # only the invalid one was reported
    assert len(harness.requests(watch=False)) == 1 and len(harness.requests(watch=True)) == 1
    assert harness.errors() == 1
    # the watch asked only for what the picker's Role grants (tests/k8s checks the Role against API_CALLS)
    asked = {(r.resource, "watch" if r.watch else "list") for r in harness.server.requests}
    assert asked <= {(resource, verb) for _, resource, verbs in API_CALLS for verb in verbs}


async def test_a_failing_api_server_keeps_the_last_priorities(harness: Harness) -> None:
    server, objectives = harness.server, harness.objectives
    await server.upsert_objective(make_objective("critical", 10))
    server.objective_list_failures = 2  # the first two lists fail
    harness.start()
    await harness.until(lambda: objectives.priority("critical") == 10, "the priorities after failures")
    assert harness.errors("RuntimeError") == 2
    await harness.until(lambda: len(harness.requests(watch=True)) == 1, "the watch")
    # dropped, changed and compacted: 410 -> a fresh list, which fails 3 times; the last priorities stay meanwhile
    server.objective_list_failures = 3
    await server.drop_watches()
    await server.upsert_objective(make_objective("critical", 11))
    server.compact()
    await harness.until(lambda: harness.errors("RuntimeError") == 5, "the failed re-lists counted")
    await harness.until(lambda: objectives.priority("critical") == 11, "the priorities once the server answers")
    assert len(harness.requests(watch=False)) == 7  # 2 failed, 1, 3 failed after the 410, 1
    before = harness.errors()
    await server.stop()  # the API server goes away: nothing changes, the watch keeps trying
    await harness.until(lambda: harness.errors() > before + 1, "failed attempts to reach the stopped API server")
    assert objectives.priority("critical") == 11
    assert harness.task is not None and not harness.task.done()


async def test_no_crd_keeps_the_files_priorities_and_is_retried_slowly(harness: Harness,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    server, objectives = harness.server, harness.objectives
    server.objectives_served = False  # the InferenceObjective CRD is not installed: 404
    caplog.set_level(logging.WARNING, logger="loadaware.fleet.discovery.objectives")
    harness.start()
    await harness.until(lambda: len(harness.requests(watch=False)) >= 3, "the list retried")
    assert objectives.known() == {"batch": -5, "legacy": 3} and harness.changes == 0
    assert harness.errors() == 0  # a setup, not a failure: no alert
    assert harness.watch.unavailable == 404
    warnings = [r.getMessage() for r in caplog.records if "CRD is not installed" in r.getMessage()]
    assert len(warnings) == 1  # logged once
    assert harness.task is not None and not harness.task.done()
    # the CRD is installed later: seen at the next retry
    server.objectives_served = True
    await server.upsert_objective(make_objective("batch", -1))
    await harness.until(lambda: objectives.priority("batch") == -1, "the objectives once the CRD is there")
    assert harness.watch.unavailable is None
    await harness.until(lambda: len(harness.requests(watch=True)) >= 1, "the watch")
    # the CRD goes again (its objectives' DELETED events aside): the last priorities stay, logged once more
    server.objectives_served = False
    await server.drop_watches()
    await harness.until(lambda: harness.watch.unavailable == 404, "the missing CRD seen by the watch")
    assert objectives.priority("batch") == -1
    assert harness.errors() == harness.errors("ClientPayloadError") == 1  # the dropped connection, not the 404


async def test_a_sidecar_with_no_pool_name_takes_every_objective_of_the_namespace(server: StandInApiServer,
                                                                                  tmp_path: Path) -> None:
    h = Harness(server, tmp_path, pool="")
    await server.upsert_objective(make_objective("critical", 10))
    await server.upsert_objective(make_objective("elsewhere", 7, pool="vllm-b"))
    h.start()
    try:
        await h.until(lambda: h.objectives.known() == {"critical": 10, "elsewhere": 7}, "every objective")
    finally:
        assert h.task is not None
        h.task.cancel()
        await asyncio.gather(h.task, return_exceptions=True)


# ---- settings and wiring ---------------------------------------------------------------------------------

def test_objectives_are_watched_with_admission_on_kubernetes_unless_turned_off() -> None:
    pool = {"LOADAWARE_DISCOVERY": "inference-pool", "LOADAWARE_INFERENCE_POOL": "vllm"}
    assert resolve({}, {**pool, "LOADAWARE_ADMISSION": "on"}).objectives_from_cluster
    assert not resolve({}, pool).objectives_from_cluster  # no admission: nobody reads priorities
    assert not resolve({}, {**pool, "LOADAWARE_ADMISSION": "on", "LOADAWARE_WATCH_OBJECTIVES": "off"}
                       ).objectives_from_cluster
    slices = ["--discovery", "kubernetes", "--k8s-service", "vllm", "--admission", "on"]
    assert from_args(slices, environ={}).objectives_from_cluster
    assert not from_args(["--endpoints", "10.0.0.1:8000", "--admission", "on"], environ={}).objectives_from_cluster
    assert not is_required("inference-objectives")  # failing, it never takes the pod out of the Service


async def test_the_sidecar_wires_the_objectives_into_admission(server: StandInApiServer, tmp_path: Path) -> None:
    await server.upsert_objective(make_objective("critical", 10))
    objectives_file = tmp_path / "objectives.json"
    objectives_file.write_text(json.dumps({"critical": {"priority": 1}, "batch": {"priority": -1}}))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(server.kubeconfig()))
    args = ["--discovery", "inference-pool", "--inference-pool", "vllm", "--k8s-namespace", "llm",
            "--kubeconfig", str(kubeconfig), "--metrics-listen", "off", "--admission", "on",
            "--objectives", str(objectives_file)]
    sidecar = Sidecar(from_args(args, environ={}))
    assert [name for name, _ in sidecar._discovery_tasks] == ["discovery-inference-pool", "inference-objectives"]
    assert sidecar.admission is not None
    objectives = sidecar.admission.objectives
    run = dict(sidecar._discovery_tasks)["inference-objectives"]
    task = asyncio.create_task(run())
    try:
        await wait_until_async(lambda: objectives.priority("critical") == 10, message="the cluster's priority",
                               interval=0.01)
        assert objectives.priority("batch") == -1  # the file's still apply where the cluster says nothing
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    off = Sidecar(from_args([*args, "--watch-objectives", "off"], environ={}))
    assert [name for name, _ in off._discovery_tasks] == ["discovery-inference-pool"]
