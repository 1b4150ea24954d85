"""Every background task of the sidecar runs here: logged, restarted with backoff, counted, and reflected in
readiness when a required one keeps failing.

A background task (discovery, the scraper, the KV-event feeds, ...) is meant to run for the life of the
process. One that raises, or returns, is restarted after a backoff that doubles per failure in a row (from
`base_s` up to `max_s`); each restart is counted in `loadaware_task_restarts_total{task}`. The first failure
in a row is logged with its traceback, later ones in one line each (the backoff bounds their rate). A
*required* task (without it decisions are wrong or impossible: discovery, the scraper, readiness itself)
that has failed `failing_after` times in a row makes `failing()` name it with the reason, which readiness
turns into NOT_SERVING; a run that stays up `stable_s` clears its streak and the reason. Cancellation (the
sidecar stopping) ends the task; it is never a failure.

Tasks that come and go with the fleet (one KV-event feed per engine, ...) are `spawn`ed by their owner, which
cancels them: supervised the same way, counted under a shared `series` (one series per kind, not per engine),
and forgotten when they end.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

TaskFactory = Callable[[], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class TaskSpec:
    name: str
    run: TaskFactory
    required: bool = False
    series: str = ""  # the metrics' task label (default: the name); spawned tasks of one kind share one

    @property
    def label(self) -> str:
        return self.series or self.name


@dataclass(frozen=True)
class SupervisorOptions:
    base_s: float = 0.5  # first restart's delay; doubled per failure in a row
    max_s: float = 30.0
    failing_after: int = 3  # failures in a row of a required task before readiness drops
    stable_s: float = 10.0  # a run this long clears the streak


@dataclass
class _Streak:
    failures: int = 0
    reason: str = ""


class Supervisor:
    def __init__(self, registry: CollectorRegistry | None = None, options: SupervisorOptions | None = None) -> None:
        self.options = options or SupervisorOptions()
        self.restarts = Counter("loadaware_task_restarts", "Background task restarts after a failure, by task",
                                ["task"], registry=registry)
        self.failing_gauge = Gauge("loadaware_task_failing", "1 while a background task keeps failing (a required "
                                   "one turns readiness NOT_SERVING)", ["task"], registry=registry)
        self._streaks: dict[str, _Streak] = {}
        self._specs: dict[str, TaskSpec] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._spawned: set[asyncio.Task[None]] = set()
        self._failing: dict[str, set[str]] = {}  # series -> its tasks past failing_after (the gauge's 1)

    def _register(self, spec: TaskSpec) -> None:
        if spec.name in self._specs:
            raise ValueError(f"two background tasks named {spec.name!r}")
        self._specs[spec.name] = spec
        self._streaks[spec.name] = _Streak()
        self.restarts.labels(spec.label)  # a series from the start: a rate() of nothing is 0, not absent
        self.failing_gauge.labels(spec.label).set(1 if self._failing.get(spec.label) else 0)

    def start(self, specs: list[TaskSpec]) -> None:
        for spec in specs:
            self._register(spec)
            self._tasks.append(asyncio.create_task(self._supervise(spec), name=spec.name))

    def spawn(self, spec: TaskSpec) -> asyncio.Task[None]:
        """Start a task its owner will cancel (e.g. an engine's KV-event feed), supervised like the others;
        its streak is forgotten when it ends."""
        self._register(spec)
        task = asyncio.create_task(self._supervise(spec), name=spec.name)
        self._spawned.add(task)
        task.add_done_callback(functools.partial(self._forget, spec.name))
        return task

    def _forget(self, name: str, task: asyncio.Task[None]) -> None:
        self._spawned.discard(task)
        spec = self._specs.pop(name, None)
        self._streaks.pop(name, None)
        if spec is not None:
            self._mark_failing(spec, False)

    def _mark_failing(self, spec: TaskSpec, failing: bool) -> None:
        """The failing gauge of a series: 1 while any of its tasks has failed failing_after times in a row."""
        names = self._failing.setdefault(spec.label, set())
        if failing:
            names.add(spec.name)
        else:
            names.discard(spec.name)
        self.failing_gauge.labels(spec.label).set(1 if names else 0)

    def failing(self) -> dict[str, str]:
        """Required tasks failing past the threshold, with the reason: readiness is NOT_SERVING while any is."""
        limit = self.options.failing_after
        return {name: streak.reason for name, streak in self._streaks.items()
                if self._specs[name].required and streak.failures >= limit}

    def state(self) -> list[dict[str, Any]]:
        """Each task as /debug/state shows it."""
        return [{"task": name, "required": self._specs[name].required, "failures_in_a_row": streak.failures,
                 "last_failure": streak.reason} for name, streak in self._streaks.items()]

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._spawned]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    async def _supervise(self, spec: TaskSpec) -> None:
        streak = self._streaks[spec.name]
        while True:
            stable = asyncio.get_running_loop().call_later(self.options.stable_s, self._stable, spec.name)
            try:
                await spec.run()
                reason = "returned"  # a background task runs for the life of the process
                failure: BaseException | None = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - whatever a task raises, it is restarted, never lost
                reason = f"{type(exc).__name__}: {exc}"[:300]
                failure = exc
            finally:
                stable.cancel()
            streak.failures += 1
            streak.reason = reason
            delay = min(self.options.max_s, self.options.base_s * 2 ** (streak.failures - 1))
            self.restarts.labels(spec.label).inc()
            if streak.failures == 1:
                log.error("background task %s failed (%s); restarting in %.1fs", spec.name, reason, delay,
                          exc_info=failure)
            else:
                log.warning("background task %s failed again (%d in a row: %s); restarting in %.1fs",
                            spec.name, streak.failures, reason, delay)
            if spec.required and streak.failures == self.options.failing_after:
                log.error("required background task %s keeps failing: readiness is NOT_SERVING until it recovers",
                          spec.name)
            if streak.failures >= self.options.failing_after:
                self._mark_failing(spec, True)
            await asyncio.sleep(delay)

    def _stable(self, name: str) -> None:
        """The task has run `stable_s` without failing: its streak is over."""
        streak = self._streaks.get(name)
        if streak is not None and streak.failures:
            if streak.failures >= self.options.failing_after:
                log.warning("background task %s recovered", name)
            streak.failures = 0
            streak.reason = ""
            self._mark_failing(self._specs[name], False)
