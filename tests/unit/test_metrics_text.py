"""/metrics written by hand (telemetry/exposition.py) is what prometheus_client's generate_latest writes for the
same registry: on a fleet with state on every endpoint (decisions, responses, routing states and ejections,
scrapes and a scraped extra, token signals, models, failures, KV-event series, the endpoint picker's per-pod
queue), label values that need escaping, values in Go's exponent form, infinities and NaN; sample for sample
through prometheus_client's parser, family by family in the same order, and byte for byte."""

from __future__ import annotations

import math

from prometheus_client import Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from loadaware.telemetry.epp import EppMetrics, PodLoad
from loadaware.telemetry.exposition import LabelLayout, TextRegistry, value_text
from loadaware.telemetry.metrics import Metrics
from loadaware.telemetry.table_series import TableCounter, TableGauge

ODD = ('odd"name\\x\ny:8000', "plain-host.example:8000")  # every character the text format escapes
SPECIAL = (0.0, 1.0, 0.1, 2.5e-7, 999999.9, 1e6, 1234567.5, 1e16, 1.5e300, -3e7, -0.5, math.inf, -math.inf,
           math.nan)


def busy_fleet(n: int) -> tuple[Metrics, tuple[str, ...], dict[str, int]]:
    """Metrics as a busy fleet leaves them: every endpoint decided, answered, scraped, signalled, listing
    models; some ejected or probing, some failing scrapes and model fetches."""
    metrics = Metrics("loadaware")
    endpoints = (*ODD, *(f"10.0.{i // 250}.{i % 250}:8000" for i in range(n)))
    pods = [PodLoad(f"pod-{i}" if i % 3 else ep, None if i % 7 == 3 else i % 5, None if i % 7 == 3 else i % 4,
                    None if i % 2 else 0.25 * (i % 4)) for i, ep in enumerate(endpoints)]
    EppMetrics(metrics.registry, 'pool "a"', lambda: pods, metrics.decision_seconds, lambda: 1000.0)
    swapped = metrics.scraped_signal("loadaware_engine_swapped", "Scraped swapped requests")
    rows = []
    for i, ep in enumerate(endpoints):
        odd = SPECIAL[i % len(SPECIAL)]
        metrics.decided(ep, "routed")
        metrics.decided(ep, "routed")
        if i % 4 == 0:
            metrics.decided(ep, "fallback_load_only")
        metrics.responded(ep, 200 if i % 5 else 503)
        state = ("healthy", "ejected", "probing")[i % 3]
        metrics.routing_state_changed(ep, state, "http_5xx")
        metrics.scraped(ep, i % 9, odd, None if i % 6 == 0 else 0.01 * i)
        swapped.labels(ep).set(i)
        rows.append((ep, i * 17, i * 3, i % 4, None if i % 5 == 0 else 0.05 + i * 1e-4, odd))
        metrics.models_seen(ep, frozenset({"m", 'we"ird\\model'} if i % 2 else {"m"}))
        if i % 8 == 0:
            metrics.scrape_failure(ep, "timeout")
            metrics.models_fetch_failure(ep, "connect")
        metrics.kv_batches.add((ep, "live"), 3)
        metrics.kv_connected.labels(ep).set(i % 2)
        metrics.approx_blocks.labels(ep).set(i * 1e5)
    metrics.token_signals_many(rows)
    metrics.fallback("prefix_error")
    metrics.stage("score", 0.0004)
    metrics.lookup_result("match")
    metrics.decision_seconds.observe(0.002)
    metrics.tokenizer_pieces_seen(10, 2, True, 300, 3)
    metrics.held({0: (2, 4096)})
    inflight = {ep: i % 3 for i, ep in enumerate(endpoints)}
    return metrics, endpoints, inflight


def parsed(text: bytes) -> tuple[list[tuple[str, str, str]], list[tuple[str, tuple[tuple[str, str], ...], str]]]:
    """(name, type, help) per family, in order, and (name, sorted labels, value's text) per sample, in order."""
    families = list(text_string_to_metric_families(text.decode()))
    heads = [(f.name, f.type, f.documentation) for f in families]
    rows = [(s.name, tuple(sorted(s.labels.items())), "NaN" if math.isnan(s.value) else repr(s.value))
            for f in families for s in f.samples]
    return heads, rows


def test_a_busy_fleets_page_is_generate_latests_sample_for_sample() -> None:
    metrics, endpoints, inflight = busy_fleet(600)
    new = metrics.render(lambda: inflight, endpoints)  # sets the render-time gauges, then writes the text
    old = generate_latest(metrics.registry)  # the same registry through prometheus_client, as before
    new_heads, new_rows = parsed(new)
    old_heads, old_rows = parsed(old)
    assert new_heads == old_heads
    assert len(new_rows) == len(old_rows) > 20 * len(endpoints)
    assert new_rows == old_rows
    assert new == old  # and today byte for byte: the series keep their order too
    text = new.decode()
    assert 'loadaware_engine_waiting{endpoint="odd\\"name\\\\x\\ny:8000"} 0.0\n' in text  # escaped as required
    assert 'inference_pool_per_pod_queue_size{model_server_pod="odd\\"name\\\\x\\ny:8000",name="pool \\"a\\""}' \
        in text


def test_an_endpoint_that_leaves_leaves_both_renderings() -> None:
    metrics, endpoints, inflight = busy_fleet(20)
    for ep in endpoints[::2]:
        metrics.forget_endpoint(ep)
        inflight.pop(ep)
    kept = endpoints[1::2]
    assert metrics.render(lambda: inflight, kept) == generate_latest(metrics.registry)
    assert f'endpoint="{endpoints[2]}"' not in metrics.render(lambda: inflight, kept).decode()


def test_a_text_kept_between_renders_follows_every_change() -> None:
    """A family's text is reused while it did not change (routing states, models, creation times): every
    kind of change between two renders shows in the next."""
    metrics, endpoints, inflight = busy_fleet(30)

    def same() -> None:
        for _ in range(3):  # the third render reuses what the second kept
            assert metrics.render(lambda: inflight, endpoints) == generate_latest(metrics.registry)

    changes = (lambda: metrics.routing_state_changed(endpoints[3], "ejected", "timeout"),
               lambda: metrics.models_seen(endpoints[4], frozenset({"m"})),  # the same list again: nothing moves
               lambda: metrics.models_seen(endpoints[4], frozenset({"m", "n"})),
               lambda: metrics.decided(endpoints[5], "no_endpoints"),  # a new series: its creation time shows
               lambda: metrics.responded(endpoints[6], 200),  # only a total moves
               lambda: metrics.kv_connected.labels(endpoints[7]).set(0.5),
               lambda: metrics.kv_connected.remove(endpoints[7]),
               lambda: metrics.forget_endpoint(endpoints[8]))
    same()
    assert metrics.routing_state._kept[1] is not None and metrics.decisions._kept[1] is not None  # reused
    assert metrics.signal_prefill._kept[1] is None  # set in bulk at every render: never kept
    for change in changes:
        change()
        same()


def test_other_label_layouts_and_a_later_collector_keep_their_place() -> None:
    registry = TextRegistry(auto_describe=True)
    four = TableGauge("loadaware_t_four", "Four labels,\nsorted", ("d", "c", "b", "a"), registry=registry)
    before = Counter("loadaware_t_plain", "An ordinary counter", ["k"], registry=registry)
    two = TableCounter("loadaware_t_two", "Two labels, reordered \\ too", ("zone", "endpoint"), registry=registry)
    for i, value in enumerate(SPECIAL):
        four.labels(f"d{i}", 'c"', "b\n", "a\\").set(value)
        two.add((f"z{i % 2}", f"e{i}"), 2)  # an int added: still written as a float
        before.labels(str(i)).inc()
    empty = TableCounter("loadaware_t_empty", "No series yet", ("endpoint",), registry=registry)
    assert len(empty) == 0
    assert registry.render() == generate_latest(registry)
    registry.unregister(before)
    assert registry.render() == generate_latest(registry) and b"loadaware_t_plain" not in registry.render()


def test_values_are_written_as_prometheus_client_writes_them() -> None:
    from prometheus_client.utils import floatToGoString

    for value in (*SPECIAL, 5e-324, 123456.789, 1e15 + 0.5, -1e6, 7e22):
        assert value_text(value) == floatToGoString(value), value
    assert LabelLayout(("endpoint",)).lines("x", [(("a",), 1.0), (("b",), math.nan)]) == \
        'x{endpoint="a"} 1.0\nx{endpoint="b"} NaN\n'
