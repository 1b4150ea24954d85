"""TableGauge (telemetry/table_gauge.py) exposes exactly what prometheus_client's Gauge does, and its series are
nothing the cyclic garbage collector walks."""

from __future__ import annotations

import gc

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from loadaware.telemetry.table_gauge import TableGauge


def both(labelnames: tuple[str, ...]) -> tuple[CollectorRegistry, Gauge, CollectorRegistry, TableGauge]:
    r1, r2 = CollectorRegistry(auto_describe=True), CollectorRegistry(auto_describe=True)
    return (r1, Gauge("loadaware_x", "What x is", labelnames, registry=r1), r2,
            TableGauge("loadaware_x", "What x is", labelnames, registry=r2))


def test_the_exposition_is_the_gauges() -> None:
    r1, gauge, r2, table = both(("endpoint", "state"))
    assert generate_latest(r1) == generate_latest(r2)  # declared, no series yet
    for g in (gauge, table):
        g.labels("10.0.0.1:8000", "healthy").set(1)
        g.labels('odd"name\\', "ejected").set(0.25)
        g.labels("10.0.0.1:8000", "healthy").set(3)  # set again: keeps its place
        g.labels("10.0.0.2:8000", "probing").set(7)
        g.remove("10.0.0.2:8000", "probing")
    assert generate_latest(r1) == generate_latest(r2)
    assert table.value("10.0.0.1:8000", "healthy") == 3.0 and len(table) == 2
    with pytest.raises(KeyError):
        table.remove("10.0.0.9:8000", "healthy")
    with pytest.raises(ValueError):
        table.labels("only-one")


def test_a_series_is_nothing_the_collector_tracks() -> None:
    table = TableGauge("loadaware_y", "y", ("endpoint",), registry=CollectorRegistry())
    gc.collect()
    before = len(gc.get_objects())
    for i in range(5_000):
        table.labels(f"10.0.{i // 250}.{i % 250}:8000").set(i)
    gc.collect()  # tuples of strings are untracked once a collection has seen them
    assert len(gc.get_objects()) - before < 50
