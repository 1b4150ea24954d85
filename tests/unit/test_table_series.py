"""TableGauge and TableCounter (telemetry/table_series.py) expose exactly what prometheus_client's Gauge and
Counter do, and their series are nothing the cyclic garbage collector walks."""

from __future__ import annotations

import gc
import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from loadaware.telemetry.table_series import TableCounter, TableGauge


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


def test_a_counter_exposes_its_total_and_created_as_the_counter() -> None:
    r1, r2 = CollectorRegistry(auto_describe=True), CollectorRegistry(auto_describe=True)
    counter = Counter("loadaware_z", "What z counts", ("endpoint", "outcome"), registry=r1)
    table = TableCounter("loadaware_z", "What z counts", ("endpoint", "outcome"), registry=r2)
    assert generate_latest(r1) == generate_latest(r2)
    counter.labels("a:1", "routed").inc()
    counter.labels("b:2", "routed").inc(2.5)
    counter.labels("a:1", "routed").inc()
    counter.labels("c:3", "none")  # a series made and never added to shows 0
    assert table.add(("a:1", "routed")) and table.labels("b:2", "routed") is not None
    table.labels("b:2", "routed").inc(2.5)
    assert not table.add(("a:1", "routed"))
    table.labels("c:3", "none")
    created = re.compile(rb"(_created\{[^}]*\}) \S+")  # the creation times differ by microseconds
    assert created.sub(rb"\1 T", generate_latest(r1)) == created.sub(rb"\1 T", generate_latest(r2))
    assert table.value("a:1", "routed") == 2.0
    table.remove("a:1", "routed")
    assert table.value("a:1", "routed") is None and b'endpoint="a:1"' not in generate_latest(r2)
    with pytest.raises(ValueError):
        table.add(("b:2", "routed"), -1)
