"""10,000 endpoint add/remove cycles leave nothing behind: the Prometheus series count and every per-endpoint
map are back at their baseline (docs/architecture.md, "Fleet size").

A started sidecar (KV-event feeds and their sweeper running, one scrape round at start; the engines are not
there) on a fleet of three; each cycle discovery adds one more endpoint, it is decided to, counted, scraped,
failed until ejected, given models, KV blocks, approximate credit, a reply, its series rendered; then it
leaves. Every 250th cycle the loop runs a while so the feeds start for it before it goes."""

from __future__ import annotations

from typing import Any

from loadaware.app import Sidecar
from loadaware.config import from_args
from loadaware.extproc.replies import ROUTE_CACHE_LIMIT
from loadaware.fleet.health import HTTP_5XX
from loadaware.fleet.models import ServedModels
from loadaware.load.tracker import EngineStats
from loadaware.prefix.approx import ApproxPrefixSource
from loadaware.prefix.kvevents.feeds import KvEventsFeeds
from loadaware.prefix.sources.approx import ApproxParts
from loadaware.prefix.sources.kv_events import KvEventsParts
from loadaware.routing.request import InferenceRequest
from testkit.paths import TINY_TOKENIZER
from tests.conftest import wait_until_async

BASE = ("127.0.0.2:18100", "127.0.0.3:18100", "127.0.0.4:18100")
CYCLES = 10_000


def series(app: Sidecar) -> int:
    return sum(1 for line in app.metrics.render(app.loads.snapshot, app.registry.snapshot()).decode().splitlines()
               if line and not line.startswith("#"))


def kv_feeds(app: Sidecar) -> KvEventsFeeds:
    parts = app.prefixes.part("kv-events", KvEventsParts)
    assert parts is not None
    return parts.feeds


def approx_source(app: Sidecar) -> ApproxPrefixSource:
    parts = app.prefixes.part("approx", ApproxParts)
    assert parts is not None
    return parts.approx


def sizes(app: Sidecar) -> dict[str, int]:
    """Every per-endpoint map the sidecar keeps, by owner."""
    t, h, m = app.loads, app.endpoint_health, app.metrics
    assert app.models is not None and app.models_poller is not None
    feeds = kv_feeds(app)
    index, approx = feeds.index, approx_source(app).index
    order = t.ordered()
    out: dict[str, Any] = {
        "tracker.counts": t._counts, "tracker.generation": t._generation, "tracker.stats": t._stats,
        "tracker.epochs": t._snapshot_epoch, "tracker.started": t._started_after, "tracker.ended": t._ended_after,
        "tracker.scrape_heap": t._scraped_at, "order": order._load, "order.buckets": order._buckets,
        "health": h._records, "health.out": h._out_set, "metrics.states": m._state_shown,
        "metrics.inflight": m._inflight_shown,
        "metrics.series": m._endpoint_series, "metrics.decisions": m.decisions._values,
        "metrics.responses": m.responses._values, "metrics.models": m._model_labels,
        "models": app.models._known, "models.serving": app.models._serving,
        "models.tried": app.models_poller._tried,
        "models.asked": app.models_poller._asked, "bridge": app.bridge._endpoint_ids,
        "kv.feeds": feeds.feeds, "kv.tasks": feeds._tasks, "kv.split": feeds.split, "kv.engines": index._engines,
        "kv.holders": index._holders, "kv.slots": index._slots.names, "kv.retired": index._retired,
        "approx.engines": approx._engines, "approx.holders": approx._holders, "approx.slots": approx._slots.names}
    return {k: len(v) for k, v in out.items()}


def settled(app: Sidecar) -> bool:
    """No feed task of a departed engine still running, and the KV index's sweeper has nothing left to do."""
    feeds = kv_feeds(app)
    fleet = set(app.registry.snapshot())
    departed = [row for row in app.supervisor.state()
                if str(row["task"]).startswith("kv-events-feed") and str(row["task"]).split()[1] not in fleet]
    return not departed and not feeds._sweep_wanted.is_set() and not feeds.index._retired


async def test_ten_thousand_add_remove_cycles_leave_every_map_and_series_at_baseline() -> None:
    app = Sidecar(from_args(["--endpoints", ",".join(BASE), "--tokenizer", str(TINY_TOKENIZER),
                             "--prefix-source", "kv-events,approx", "--listen", "127.0.0.1:0", "--admin-listen", "off",
                             "--metrics-listen", "off", "--admin-http-listen", "off", "--scrape-interval-s", "3600",
                             "--scrape-stale-s", "3600",
                             "--kv-events-port", "1", "--kv-events-replay-port", "2"], environ={}))
    await app.start()
    replies = app.extproc.buffered.replies
    feeds, approx = kv_feeds(app), approx_source(app)
    assert app.models is not None
    tokens = list(range(64))
    try:
        async def cycle(i: int) -> None:
            ep = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:8000"
            app.registry.set((*BASE, ep))
            if i % 250 == 0:  # the feeds start for it (the registry's change wakes their manager)
                await wait_until_async(lambda: ep in feeds.feeds, message=f"a feed for {ep}")
            decision = await app.decider.decide(InferenceRequest("completions", prompt=tokens), f"churn-{i}")
            app.lifecycle.responded(decision, 200, ep)  # served by the newcomer (a retry walked there)
            app.loads.record(ep, EngineStats(1, 2, 0.5, app.loads.clock()))
            app.metrics.scraped(ep, 1, 2, 0.5)
            app.metrics.scrape_failure(ep, "timeout")
            for _ in range(3):
                app.endpoint_health.failed(ep, HTTP_5XX)
            app.metrics.decided(ep, "routed")
            app.metrics.responded(ep, 503)
            assert app.models is not None
            app.models.record(ep, ServedModels(frozenset({"m", f"lora-{i % 7}"})))
            app.metrics.models_seen(ep, frozenset({"m", f"lora-{i % 7}"}))
            app.metrics.models_fetch_failure(ep, "timeout")
            feeds.index.store(ep, [i * 4 + k for k in range(4)], None, tokens, 16)
            approx.routed(tokens, ep)
            replies.body_route((ep, *BASE))
            if i % 1000 == 0:
                await app.metrics_page.render()
            app.registry.set(BASE)
            app.lifecycle.ended(decision)  # a late end: a no-op for the departed endpoint's count

        await cycle(0)  # the first creates the series that are not per endpoint (reasons, resets, ...)
        await wait_until_async(lambda: settled(app), message="the departed feed's task ended and the sweep is done")
        baseline_series, baseline_maps = series(app), sizes(app)
        for i in range(1, CYCLES + 1):
            await cycle(i)
        await wait_until_async(lambda: settled(app), message="every departed feed's task ended and the sweep is done")
        assert series(app) == baseline_series
        maps = sizes(app)
        # The scrape-expiry heap is compacted when it outgrows twice the live stats: bounded, not exact.
        assert maps.pop("tracker.scrape_heap") <= 2 * maps["tracker.stats"] + 64
        baseline_maps.pop("tracker.scrape_heap")
        assert maps == baseline_maps
        assert len(replies._route_body) <= ROUTE_CACHE_LIMIT
        assert app.loads.total() == 0
    finally:
        await app.stop()
