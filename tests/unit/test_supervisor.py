"""The supervisor of background tasks (loadaware/tasks/supervisor.py): restart with backoff, count, and
readiness down while a required task keeps failing; then each of the sidecar's own tasks made to fail."""

from __future__ import annotations

import asyncio
import logging
from functools import partial

import pytest
from prometheus_client import CollectorRegistry

from loadaware.app import Sidecar
from loadaware.config import from_args
from loadaware.runtime.readiness import is_required
from loadaware.tasks.supervisor import Supervisor, SupervisorOptions, TaskSpec
from testkit.ports import free_port
from tests.conftest import wait_until_async

FAST = SupervisorOptions(base_s=0.01, max_s=0.05, failing_after=3, stable_s=0.3)


def restarts(registry: CollectorRegistry, task: str) -> float:
    return registry.get_sample_value("loadaware_task_restarts_total", {"task": task}) or 0.0


async def test_a_failing_task_is_restarted_counted_and_marks_required_failing_until_it_recovers(
        caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    supervisor = Supervisor(registry, FAST)
    runs = {"n": 0}
    healthy_after = 5

    async def flaky() -> None:
        runs["n"] += 1
        if runs["n"] < healthy_after:
            raise RuntimeError(f"boom {runs['n']}")
        await asyncio.sleep(3600)

    async def optional() -> None:
        raise ValueError("optional helper down")

    with caplog.at_level(logging.WARNING, logger="loadaware.tasks.supervisor"):
        supervisor.start([TaskSpec("needed", flaky, required=True), TaskSpec("extra", optional)])
        await wait_until_async(lambda: supervisor.failing().get("needed", "").startswith("RuntimeError: boom"),
                               message="the required task is reported failing")
        assert "extra" not in supervisor.failing()  # an optional task never takes readiness down
        await wait_until_async(lambda: runs["n"] >= healthy_after, message="restarted until it stays up")
        await wait_until_async(lambda: not supervisor.failing(), timeout=3, message="recovered after stable_s")
        await wait_until_async(lambda: restarts(registry, "extra") >= 5, message="the optional one keeps restarting")
        await supervisor.stop()
    assert restarts(registry, "needed") == healthy_after - 1
    assert registry.get_sample_value("loadaware_task_failing", {"task": "needed"}) == 0
    assert registry.get_sample_value("loadaware_task_failing", {"task": "extra"}) == 1
    tracebacks = [r for r in caplog.records if r.exc_info and "needed" in r.getMessage()]
    assert len(tracebacks) == 1  # one traceback per streak, one line per later failure
    assert any("keeps failing" in r.getMessage() for r in caplog.records)


async def test_spawned_tasks_share_a_series_restart_with_backoff_and_are_forgotten_when_cancelled() -> None:
    """Tasks that come and go with the fleet (one KV-event feed per engine): each restarts on its own backoff,
    all count under their series, the series is failing while any of them keeps failing, and a cancelled one
    leaves no streak behind."""
    registry = CollectorRegistry()
    supervisor = Supervisor(registry, FAST)
    starts: dict[str, list[float]] = {"a": [], "b": []}
    loop = asyncio.get_running_loop()

    async def crashing(name: str) -> None:
        starts[name].append(loop.time())
        raise OSError(f"feed {name} broke")

    async def steady() -> None:
        await asyncio.sleep(3600)

    a = supervisor.spawn(TaskSpec("feed a", partial(crashing, "a"), series="feeds"))
    b = supervisor.spawn(TaskSpec("feed b", partial(crashing, "b"), series="feeds"))
    calm = supervisor.spawn(TaskSpec("feed c", steady, series="feeds"))
    with pytest.raises(ValueError):
        supervisor.spawn(TaskSpec("feed a", steady))  # one name, one task
    await wait_until_async(lambda: min(len(v) for v in starts.values()) >= 4, message="both restarted")
    gaps = [later - earlier for earlier, later in zip(starts["a"], starts["a"][1:])]
    assert gaps[1] >= gaps[0] * 1.5 and gaps[-1] <= FAST.max_s * 3  # the delay doubles, up to max_s
    assert restarts(registry, "feeds") >= 6 and restarts(registry, "feed a") == 0  # one series for the kind
    assert registry.get_sample_value("loadaware_task_failing", {"task": "feeds"}) == 1
    assert not supervisor.failing()  # spawned tasks are optional: readiness stands
    a.cancel()
    b.cancel()
    await asyncio.gather(a, b, return_exceptions=True)
    await asyncio.sleep(0)  # the done callbacks
    assert {row["task"] for row in supervisor.state()} == {"feed c"}  # the cancelled ones are forgotten
    assert registry.get_sample_value("loadaware_task_failing", {"task": "feeds"}) == 0  # the one left is healthy
    await supervisor.stop()
    assert calm.cancelled()


async def test_a_task_that_returns_is_restarted_and_cancellation_is_not_a_failure() -> None:
    registry = CollectorRegistry()
    supervisor = Supervisor(registry, FAST)
    ran = asyncio.Event()

    async def returns() -> None:
        ran.set()

    async def forever() -> None:
        await asyncio.sleep(3600)

    supervisor.start([TaskSpec("returns", returns), TaskSpec("forever", forever, required=True)])
    await wait_until_async(lambda: restarts(registry, "returns") >= 2, message="a returned task restarts")
    await supervisor.stop()
    assert restarts(registry, "forever") == 0 and not supervisor.failing()
    assert supervisor.state()[0]["last_failure"] == "returned"


def restarted_thrice(registry: CollectorRegistry, task: str) -> bool:
    return restarts(registry, task) >= 3


def sidecar(*extra: str) -> Sidecar:
    return Sidecar(from_args(["--listen", f"127.0.0.1:{free_port()}", "--metrics-listen", "off",
                              "--admin-listen", "off", "--admin-http-listen", "off", *extra], environ={}))


async def test_each_background_task_of_the_sidecar_is_supervised() -> None:
    """Every task the sidecar starts (static fleet, approx + kv-events sources, models) made to fail in turn:
    each is restarted and counted; a required one takes readiness down, an optional one does not."""
    app = sidecar("--endpoints", "127.0.0.1:1", "--prefix-source", "kv-events", "--kv-events-port", "1",
                  "--scrape-interval-s", "0.05", "--scrape-stale-s", "5")
    app.supervisor.options = SupervisorOptions(base_s=0.01, max_s=0.05, failing_after=3, stable_s=10.0)
    original = app.supervisor.start
    names: list[str] = []
    target = {"name": ""}

    def start(specs: list[TaskSpec]) -> None:
        names.extend(spec.name for spec in specs)
        original([spec if spec.name != target["name"] else TaskSpec(spec.name, broken, spec.required)
                  for spec in specs])

    async def broken() -> None:
        raise OSError("made to fail")

    app.supervisor.start = start  # type: ignore[method-assign]
    await app.start()
    await app.stop()
    assert {"scraper", "readiness", "models"} <= set(names) and any(n.startswith("kv-events") for n in names)
    for name in list(names):
        app = sidecar("--endpoints", "127.0.0.1:1", "--prefix-source", "kv-events", "--kv-events-port", "1",
                      "--scrape-interval-s", "0.05", "--scrape-stale-s", "5")
        app.supervisor.options = SupervisorOptions(base_s=0.01, max_s=0.05, failing_after=3, stable_s=10.0)
        original = app.supervisor.start
        target["name"] = name
        app.supervisor.start = start  # type: ignore[method-assign]
        await app.start()
        try:
            await wait_until_async(partial(restarted_thrice, app.metrics.registry, name), message=f"{name} restarted")
            if is_required(name):
                assert name in app.supervisor.failing() and not app.readiness.ready()
                assert "made to fail" in app.readiness.reason()
            else:
                assert name not in app.supervisor.failing()
        finally:
            await app.stop()


async def test_missing_kubeconfig_says_so_and_turns_readiness_not_serving(caplog: pytest.LogCaptureFixture) -> None:
    app = sidecar("--discovery", "kubernetes", "--k8s-service", "vllm", "--k8s-namespace", "default",
                  "--kubeconfig", "/nonexistent/kubeconfig")
    app.supervisor.options = SupervisorOptions(base_s=0.01, max_s=0.05, failing_after=3, stable_s=10.0)
    with caplog.at_level(logging.INFO):
        await app.start()
        try:
            await wait_until_async(lambda: "discovery-kubernetes" in app.supervisor.failing(),
                                   message="discovery reported failing")
            reason = app.readiness.reason()
            assert "discovery-kubernetes" in reason
            await wait_until_async(lambda: any("NOT_SERVING (task discovery-kubernetes" in r.getMessage()
                                               for r in caplog.records), message="health says why")
        finally:
            await app.stop()
    assert any(r.name == "loadaware.tasks.supervisor" and r.levelno == logging.ERROR for r in caplog.records)
