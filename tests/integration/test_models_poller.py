"""The models poller against real simulated engines: what each serves (served names, LoRA adapters with
their parent), a failing engine keeping its last list and being counted, discovery additions fetched
promptly, removals forgotten; and the engines' own 404 for a model they do not serve."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from loadaware.fleet.models import EndpointModels
from loadaware.fleet.models_poller import ModelsPoller
from loadaware.fleet.registry import EndpointRegistry
from loadaware.telemetry.metrics import Metrics
from sim.fleet import Fleet, start_fleet
from sim.models import parse_fleet_models
from tests.conftest import wait_until_async

SPEC = "model-a;model-b,b-chat+b-sql=/loras/sql"


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    f = await start_fleet(2, base_ip="127.0.0.52", port=0, models=parse_fleet_models(SPEC, 2))
    yield f
    await f.stop()


def endpoint(fleet: Fleet, i: int) -> str:
    e = fleet.engines[i]
    return f"{e.ip}:{e.port}"


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_poller_reads_every_engines_models_and_keeps_the_last_list_on_failure(fleet: Fleet) -> None:
    a, b = endpoint(fleet, 0), endpoint(fleet, 1)
    registry = EndpointRegistry([a, b])
    store = EndpointModels(stale_s=60)
    metrics = Metrics("loadaware")
    registry.on_removed(store.forget)
    registry.on_removed(metrics.forget_endpoint)
    poller = ModelsPoller(registry, store, metrics, interval_s=60, timeout_s=1)
    task = asyncio.create_task(poller.run())
    try:
        await wait_until_async(lambda: poller.rounds >= 1, message="a first round")
        assert store.state([a, b]) == {a: {"models": ["model-a"], "adapters": {}},
                                       b: {"models": ["b-chat", "b-sql", "model-b"], "adapters": {"b-sql": "model-b"}}}
        assert store.pool("b-sql", (a, b)) == (b,) and store.pool("model-a", (a, b)) == (a,)
        assert value(metrics, "loadaware_endpoint_models", endpoint=b, model="b-sql") == 1
        # Engine b stops answering: its fetches fail (counted), its last good list stays.
        await fleet.engines[1].stop()
        await poller.fetch([b])
        assert (value(metrics, "loadaware_models_fetch_failures_total", endpoint=b, reason="error") or 0) >= 1
        assert store.pool("model-b", (a, b)) == (b,)
        # Discovery adds an endpoint (nothing listens there: it fails, stays unknown, so it serves anything)
        # and it is tried long before the 60 s round; removing b forgets its list and its metric.
        ghost = "127.0.0.55:9"
        registry.set([a, b, ghost])
        await wait_until_async(lambda: value(metrics, "loadaware_models_fetch_failures_total", endpoint=ghost,
                                             reason="error") is not None, message="the new endpoint fetched")
        assert poller.rounds == 1 and store.pool("model-b", (a, b, ghost)) == (b, ghost)
        registry.set([a, ghost])
        assert store.models_of(b) is None and value(metrics, "loadaware_endpoint_models", endpoint=b,
                                                     model="b-sql") is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_engine_serves_its_names_and_adapters_and_404s_others(fleet: Fleet) -> None:
    url = fleet.engines[1].url
    async with aiohttp.ClientSession() as http:
        for model in ("model-b", "b-chat", "b-sql"):
            async with http.post(url + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2}) as r:
                assert r.status == 200, (model, await r.text())
        async with http.post(url + "/v1/completions", json={"model": "model-a", "prompt": "hi"}) as r:
            assert r.status == 404
            assert await r.json() == {"error": {"message": "The model `model-a` does not exist.",
                                                "type": "NotFoundError", "param": "model", "code": 404}}
