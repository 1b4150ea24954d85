"""A labelled gauge kept as plain numbers: one per series in a dict, exposed through a custom collector.

Why not prometheus_client's Gauge: each of its label children is three objects the cyclic garbage collector
tracks (the child, its lock, its value), and the per-endpoint gauges have one to three children per endpoint
each: at 10,000 endpoints ~120,000 tracked objects that live as long as the endpoint and that every full
collection walked (~20 ms of the event loop, `python -m bench.fleet_size`). Here a series is a float in a dict
keyed by a tuple of label strings, none of which the collector tracks, and the exposition is the same:
`# HELP`, `# TYPE gauge`, one sample per series in the order the series were first set.

Thread safety: the event loop sets and removes series; `/metrics` renders in a worker thread and copies the
dict's items in one C call, which the GIL does not interrupt.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class _Series:
    """What `labels(...)` returns: the series to set (made per call and dropped: it holds no state)."""

    __slots__ = ("_key", "_values")

    def __init__(self, values: dict[tuple[str, ...], float], key: tuple[str, ...]) -> None:
        self._values = values
        self._key = key

    def set(self, value: float) -> None:
        self._values[self._key] = float(value)


class TableGauge(Collector):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
                 ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._values: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def labels(self, *values: str) -> _Series:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values!r}")
        return _Series(self._values, tuple(str(v) for v in values))

    def remove(self, *values: str) -> None:
        """Forget a series; KeyError when it was never set (as prometheus_client's Gauge.remove)."""
        del self._values[tuple(str(v) for v in values)]

    def value(self, *values: str) -> float | None:
        return self._values.get(tuple(values))

    def __len__(self) -> int:
        return len(self._values)

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        for key, value in list(self._values.items()):
            family.add_metric(key, value)
        yield family
