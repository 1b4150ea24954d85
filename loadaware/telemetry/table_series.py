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
from collections.abc import Iterator, Sequence
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
        registry.register(self)

    def _key(self, values: Sequence[str]) -> tuple[str, ...]:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {tuple(values)!r}")
        return tuple(str(v) for v in values)

    def remove(self, *values: str) -> None:
        """Forget a series; KeyError when it was never set (as prometheus_client's remove)."""
        key = self._key(values)
        del self._values[key]
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


class _GaugeSeries:
    """What `TableGauge.labels(...)` returns: the series to set (it holds no state of its own)."""

    __slots__ = ("_key", "_values")

    def __init__(self, values: dict[tuple[str, ...], float], key: tuple[str, ...]) -> None:
        self._values = values
        self._key = key

    def set(self, value: float) -> None:
        self._values[self._key] = float(value)


class TableGauge(_Table):
    def labels(self, *values: str) -> _GaugeSeries:
        return _GaugeSeries(self._values, self._key(values))

    def series(self) -> dict[tuple[str, ...], float]:
        """The series themselves, for a caller that sets thousands at once (the render thread's gauges): a
        plain `series[key] = float(value)` each, with no object made per set. Values must be floats."""
        return self._values

    def exposition(self) -> str:
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
        series = self._series()
        total = self.name + "_total"
        text = family_header(total, self.documentation, "counter") + self._layout.lines(total, series)
        created = self._created.copy()  # a series made meanwhile may have no creation time yet: left out,
        timed = [(key, t) for key, _ in series if (t := created.get(key)) is not None]  # as generate_latest does
        if not timed:
            return text
        name = self.name + "_created"
        return text + family_header(name, self.documentation, "gauge") + self._layout.text_lines(name, timed)
