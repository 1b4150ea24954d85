"""The seams a large fleet needs: the registry's events, KV-index drops in slices, the route-reply LRU, the
recent ring's ranked head."""

from __future__ import annotations

import json
import random

from loadaware.api.offloop import dumps_in_pieces
from loadaware.extproc.replies import ROUTE_CACHE_LIMIT, Replies
from loadaware.fleet.models import EndpointModels, ServedModels
from loadaware.fleet.registry import EndpointRegistry, FleetEvents
from loadaware.lifecycle import Decision
from loadaware.policies import Candidate
from loadaware.prefix.blocks import SWEEP_SLICE_KEYS, BlockIndex, block_keys
from loadaware.telemetry.decisions import RING_CANDIDATES, RecentDecisions

BS = 16


def test_the_registry_announces_removals_then_additions_then_the_new_set() -> None:
    registry = EndpointRegistry(["a:1", "b:1"])
    heard: list[tuple[str, object]] = []
    registry.subscribe(FleetEvents(lambda ep: heard.append(("added", ep)), lambda ep: heard.append(("removed", ep)),
                                   lambda eps: heard.append(("changed", eps))))
    registry.set(["b:1", "c:1", "d:1"])
    assert heard == [("removed", "a:1"), ("added", "c:1"), ("added", "d:1"), ("changed", ("b:1", "c:1", "d:1"))]
    heard.clear()
    registry.set(["b:1", "c:1", "d:1"])  # the same set: no news
    assert heard == []
    assert "c:1" in registry and "a:1" not in registry and registry.position("d:1") == 2


def test_a_failing_listener_costs_the_others_nothing() -> None:
    registry = EndpointRegistry(["a:1"])
    seen: list[str] = []

    def boom(endpoint: str) -> None:
        raise RuntimeError("listener bug")

    registry.subscribe(FleetEvents(added=boom, removed=boom))
    registry.on_removed(seen.append)
    registry.set(["b:1"])
    assert seen == ["a:1"] and registry.snapshot() == ("b:1",)


def store(index: BlockIndex, engine: str, tokens: list[int], salt: int = 0) -> None:
    hashes = [hash((engine, salt, i)) for i in range(len(tokens) // BS)]
    index.store(engine, hashes, None, tokens, BS)


def test_a_dropped_engine_is_unheld_in_slices_and_never_credited_meanwhile() -> None:
    index = BlockIndex()
    woken: list[int] = []
    index.on_retired = lambda: woken.append(1)
    big = list(range(BS * (SWEEP_SLICE_KEYS * 2 + 100)))  # a chain of ~2.0 slices' worth of blocks
    store(index, "e:1", big)
    store(index, "f:1", big[:BS * 8])
    keys = block_keys(big, BS)
    assert index.match(keys, BS, ["e:1", "f:1"]) == {"e:1": len(keys) * BS, "f:1": 8 * BS}
    index.clear("e:1")  # e.g. AllBlocksCleared: the engine stays, its old keys are swept later
    assert woken and index.blocks("e:1") == 0
    store(index, "e:1", big[:BS * 2])  # it stores again meanwhile, under a fresh slot
    assert index.match(keys, BS, ["e:1", "f:1"]) == {"e:1": 2 * BS, "f:1": 8 * BS}
    index.drop("f:1")
    slices = 0
    while index.sweep():
        slices += 1
        # what is left of the old slots credits nobody, whoever asks
        assert index.match(keys, BS, ["e:1", "f:1"]) == {"e:1": 2 * BS}
    assert slices >= 2  # the big engine took more than one slice
    assert index.held_keys() == 2 and index.match(keys, BS, ["e:1"]) == {"e:1": 2 * BS}


def test_without_a_driver_a_drop_is_done_at_once() -> None:
    index = BlockIndex()
    store(index, "e:1", list(range(BS * 40)))
    index.drop("e:1")
    assert index.held_keys() == 0 and not index.sweep()


def test_the_route_reply_cache_is_an_lru() -> None:
    replies = Replies("x-gateway-destination-endpoint")
    hot = ("10.0.0.1:8000",)
    first = replies.body_route(hot)
    for i in range(ROUTE_CACHE_LIMIT * 2):
        replies.body_route((f"10.1.{i // 250}.{i % 250}:8000",))
        if i % 100 == 0:
            assert replies.body_route(hot) is first  # in use: kept
    assert len(replies._route_body) == ROUTE_CACHE_LIMIT
    assert ("10.1.0.0:8000",) not in replies._route_body  # the least recently used went


def test_the_recent_ring_keeps_the_ranked_head_only() -> None:
    candidates = tuple(Candidate(f"10.0.0.{i}:8000", 0, float(i % 7)) for i in range(200))
    scores = tuple(-c.load for c in candidates)
    d = Decision("r", "10.0.0.7:8000", "routed", (), 0, candidates, scores, {}, 0.0,
                 ranked=("10.0.0.7:8000", "10.0.0.14:8000"))
    RecentDecisions().on_decided(d)
    assert len(d.candidates) == RING_CANDIDATES == len(d.scores)
    assert d.candidates[0].endpoint == "10.0.0.7:8000" and d.candidates[1].endpoint == "10.0.0.14:8000"
    assert all(s == 0.0 for s in d.scores[:RING_CANDIDATES])  # the 29 zero-load ones lead; only the best kept


def test_a_page_encoded_in_pieces_is_the_same_json() -> None:
    rows = [{"endpoint": f"10.0.0.{i}:8000", "load": i / 2, "routing_health": {"state": "healthy", "failures": {}},
             "models": None if i % 2 else {"models": ["m"], "adapters": {}}, "scraped": None} for i in range(300)]
    doc = {"ready": True, "endpoints": rows, "inflight": {r["endpoint"]: i for i, r in enumerate(rows)},
           "prefix": {"sources": ["approx"], "approx": {"engines": {}, "evicted": {"decay": 0}}}, "empty": []}
    assert json.loads(dumps_in_pieces(doc)) == json.loads(json.dumps(doc)) == doc


def test_a_model_pool_from_the_index_is_the_pool_the_lists_give() -> None:
    """The index (a model every known engine serves: the whole set at once) against the lists themselves, while
    lists come, change, go stale and leave. None and "every endpoint" mean the same to the decider."""
    rng = random.Random(3)
    now = [0.0]
    store = EndpointModels(stale_s=30, clock=lambda: now[0])
    eps = tuple(f"10.0.0.{i}:8000" for i in range(40))
    lists: dict[str, tuple[frozenset[str], float]] = {}
    for step in range(3000):
        ep = rng.choice(eps)
        roll = rng.random()
        if roll < 0.4:
            ids = frozenset(rng.sample(["m", "n", "lora"], rng.choice((1, 2))))
            ids |= {"m"} if rng.random() < 0.8 else set()
            store.record(ep, ServedModels(ids))
            lists[ep] = (ids, now[0])
        elif roll < 0.5:
            store.forget(ep)
            lists.pop(ep, None)
        else:
            now[0] += rng.choice((0.5, 2.0, 11.0))
        model = rng.choice(["m", "n", "lora", "other"])
        fresh = {e: ids for e, (ids, at) in lists.items() if now[0] - at <= 30}
        want = tuple(e for e in eps if e not in fresh or model in fresh[e])
        got = store.pool(model, eps)
        assert (eps if got is None else got) == (want if any(e in fresh for e in eps) else eps), step
