"""Labelled gauges and counters kept as plain numbers: one float per series in a dict, exposed through a
custom collector.

Why not prometheus_client's Gauge and Counter: each of their label children is three objects the cyclic garbage
collector tracks (the child, its lock, its value), and the per-endpoint metrics have one to three series per
endpoint each: at 10,000 endpoints well over 100,000 tracked objects that live as long as the endpoint and that
every full collection walked (~20 ms of the event loop, `python -m bench.fleet_size`). Here a series is a float
in a dict keyed by a tuple of label strings, none of which the collector tracks, and the exposition is the
same: `# HELP`, `# TYPE`, one sample per series in the order the series were first set (a counter's `_total`
and `_created`, as prometheus_client writes them).

Rendering: a table writes its own text (telemetry/exposition.py), one f-string per series, rather than a
Sample per series through generate_latest; a counter's `_created` values are kept as the text they render to.

Thread safety: the event loop sets, adds and removes series; `/metrics` renders in a worker thread and copies
a dict's items in one C call, which the GIL does not interrupt.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from loadaware.telemetry.exposition import LabelLayout, TextCollector, family_header, value_text


class _Table(TextCollector):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
                 ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._values: dict[tuple[str, ...], float] = {}
        self._layout = LabelLayout(self.labelnames)
        # What a render can reuse: the series' version (bumped by every change a render could show) and the
        # text written at that version, kept only once the version held from one render to the next (see
        # _kept_text).
        self._version = 0
        self._kept: tuple[int, str | None] = (-1, None)
        registry.register(self)

    def _key(self, values: Sequence[str]) -> tuple[str, ...]:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {tuple(values)!r}")
        return tuple(str(v) for v in values)

    def remove(self, *values: str) -> None:
        """Forget a series; KeyError when it was never set (as prometheus_client's remove)."""
        key = self._key(values)
        del self._values[key]
        self._version += 1
        self._removed(key)

    def _removed(self, key: tuple[str, ...]) -> None:
        pass

    def value(self, *values: str) -> float | None:
        return self._values.get(tuple(values))

    def __len__(self) -> int:
        return len(self._values)

    def _family(self) -> GaugeMetricFamily | CounterMetricFamily:
        raise NotImplementedError

    def _add(self, family: Any, key: tuple[str, ...], value: float) -> None:
        family.add_metric(key, value)

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        family = self._family()
        for key, value in list(self._values.items()):
            self._add(family, key, value)
        yield family

    def _series(self) -> list[tuple[tuple[str, ...], float]]:
        """The series as (label values, value), copied in one C call (the loop may change the dict meanwhile)."""
        return list(self._values.items())

    def _kept_text(self, version: int, write: Callable[[], str]) -> str:
        """The text at `version` (read before `write` reads the series: a change in between makes the next
        render write again), written again only when the version moved. A text is kept only when the version
        did not move since the render before: a family that changes between every two scrapes (loads,
        signals) holds no copy of its text, one that rarely changes (routing states, models, counters'
        creation times) is written once per change."""
        kept_version, text = self._kept
        if text is not None and kept_version == version:
            return text
        text = write()
        self._kept = (version, text if kept_version == version else None)
        return text


class _GaugeSeries:
    """What `TableGauge.labels(...)` returns: the series to set (it holds no state of its own)."""

    __slots__ = ("_gauge", "_key")

    def __init__(self, gauge: TableGauge, key: tuple[str, ...]) -> None:
        self._gauge = gauge
        self._key = key

    def set(self, value: float) -> None:
        gauge, value = self._gauge, float(value)
        values = gauge._values
        if values.get(self._key) != value:  # the same value again (a model list polled again) changes nothing
            values[self._key] = value
            gauge._version += 1


class TableGauge(_Table):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
                 ) -> None:
        super().__init__(name, documentation, labelnames, registry)
        self._handed_out = False  # series() was called: writes no longer bump the version, nothing is reused

    def labels(self, *values: str) -> _GaugeSeries:
        return _GaugeSeries(self, self._key(values))

    def series(self) -> dict[tuple[str, ...], float]:
        """The series themselves, for a caller that sets thousands at once (the render thread's gauges): a
        plain `series[key] = float(value)` each, with no object made per set. Values must be floats. The
        gauge's text is then written at every render."""
        self._handed_out = True
        return self._values

    def exposition(self) -> str:
        if self._handed_out:
            return self._text()
        return self._kept_text(self._version, self._text)

    def _text(self) -> str:
        return family_header(self.name, self.documentation, "gauge") + self._layout.lines(self.name, self._series())

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)


class _CounterSeries:
    """What `TableCounter.labels(...)` returns: the series to add to (it holds no state of its own)."""

    __slots__ = ("_counter", "_key")

    def __init__(self, counter: TableCounter, key: tuple[str, ...]) -> None:
        self._counter = counter
        self._key = key

    def inc(self, amount: float = 1.0) -> None:
        self._counter.add(self._key, amount)


class TableCounter(_Table):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
                 ) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, registry)
        # Each series' creation time as the text it renders to: formatting a wall-clock time is the slow path
        # of floatToGoString (Go's exponent form), paid here once rather than at every render.
        self._created: dict[tuple[str, ...], str] = {}

    def labels(self, *values: str) -> _CounterSeries:
        key = self._key(values)
        if key not in self._values:
            self._values[key] = 0.0
            self._created[key] = value_text(time.time())
            self._version += 1  # the version follows the creation times: the totals are written every render
        return _CounterSeries(self, key)

    def add(self, key: tuple[str, ...], amount: float = 1.0) -> bool:
        """Add to the series `key` (label values as strings, in order); True when this made the series."""
        if amount < 0:
            raise ValueError("counters only go up")
        values = self._values
        value = values.get(key)
        if value is None:
            values[key] = float(amount)  # a float whatever was added: the text is a float's
            self._created[key] = value_text(time.time())
            self._version += 1
            return True
        values[key] = value + amount
        return False

    def _removed(self, key: tuple[str, ...]) -> None:
        self._created.pop(key, None)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Any, key: tuple[str, ...], value: float) -> None:
        created = self._created.get(key)
        family.add_metric(key, value, created=None if created is None else float(created))

    def exposition(self) -> str:
        """The totals, written every render (they move with every request), then the creation times, kept
        between renders while no series came or went. Both are read from their own dict: a series made or
        removed while the page renders may show its total and not its creation time, or the other way round
        (Prometheus takes either)."""
        total = self.name + "_total"
        version = self._version
        text = family_header(total, self.documentation, "counter") + self._layout.lines(total, self._series())
        return text + self._kept_text(version, self._created_text)

    def _created_text(self) -> str:
        timed = list(self._created.items())
        if not timed:
            return ""
        name = self.name + "_created"
        return family_header(name, self.documentation, "gauge") + self._layout.text_lines(name, timed)
