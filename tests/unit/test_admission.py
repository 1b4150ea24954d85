"""Admission under saturation: the held queue's order, the room formula, the controller's verdicts, and the
ext_proc conversations' replies (held with Envoy's timer extended, 429 with Retry-After and a reason)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2

from bench.extproc_inprocess import buffered_messages, duplex_messages
from loadaware.admission.controller import AdmissionController, AdmissionSettings, Verdict
from loadaware.admission.flow_queue import FlowQueue, Ticket
from loadaware.admission.objectives import (
    DEFAULT_PRIORITY,
    Objectives,
    ObjectivesError,
    load_objectives,
    parse_objectives,
)
from loadaware.admission.reserve import TopDemand, top_reserve
from loadaware.admission.saturation import PoolRoom, learn_slots, room
from loadaware.admission.state_view import jain_index
from loadaware.api.v1 import loadaware_pb2 as v1
from loadaware.app import Sidecar
from loadaware.config import from_args
from loadaware.lifecycle import Decision
from loadaware.load.tracker import EngineStats
from tests.unit.test_extproc_duplex import Recorder

OBJECTIVES = {"critical": 10, "standard": 0, "batch": -1}


def ticket(priority: int, tenant: str, n: int = 0, size: int = 10) -> Ticket:
    return Ticket(priority, tenant, size, float(n), request_id=f"{tenant}-{n}")


# ---- the held queue ----

def test_bands_release_highest_priority_first_and_fifo_within_a_tenant() -> None:
    q = FlowQueue()
    for t in (ticket(0, "a", 1), ticket(-1, "a", 2), ticket(10, "a", 3), ticket(0, "a", 4)):
        q.push(t)
    assert [q.pop().request_id for _ in range(4)] == ["a-3", "a-1", "a-4", "a-2"]  # type: ignore[union-attr]
    assert q.pop() is None and len(q) == 0 and q.size == 0


def test_tenants_take_turns_within_a_band_whatever_their_backlog() -> None:
    q = FlowQueue()
    for n in range(20):
        q.push(ticket(0, "heavy", n))
    for n in range(2):
        q.push(ticket(0, "light", 100 + n))
    order = [q.pop().fairness_id for _ in range(6)]  # type: ignore[union-attr]
    assert order == ["heavy", "light", "heavy", "light", "heavy", "heavy"]


def test_discard_drops_counts_at_once_and_the_rotation_skips_it() -> None:
    q = FlowQueue()
    a, b, c = ticket(0, "x", 1, size=5), ticket(0, "x", 2, size=7), ticket(0, "y", 3, size=11)
    for t in (a, b, c):
        q.push(t)
    assert q.discard(a) and not q.discard(a)
    assert (len(q), q.size, q.bands()) == (2, 18, {0: (2, 18)})
    assert q.pop() is b and q.pop() is c and q.pop() is None
    assert q.bands() == {}


def test_expiries_during_a_long_saturation_do_not_grow_the_queue() -> None:
    q = FlowQueue()
    q.push(ticket(0, "keeper", 0))  # the band never empties
    for n in range(10_000):
        t = ticket(0, f"t{n % 7}", n)
        q.push(t)
        q.discard(t)
    band = q._bands[0]
    assert len(q) == 1 and sum(len(f) for f in band.flows.values()) <= 1 + 64 + 2


def test_the_eviction_victim_is_the_newest_of_the_lowest_sheddable_band_below_the_arrival() -> None:
    q = FlowQueue()
    old, new, std = ticket(-5, "a", 1), ticket(-5, "a", 2), ticket(0, "a", 3)
    for t in (old, new, ticket(-1, "a", 4), std):
        q.push(t)
    assert q.lowest_sheddable(below=10) is new
    assert q.lowest_sheddable(below=-5) is None  # nothing lower than the arrival
    q2 = FlowQueue()
    q2.push(std)
    assert q2.lowest_sheddable(below=10) is None  # priority 0 is never shed


def test_jain_index() -> None:
    assert jain_index([10, 10]) == 1.0 and jain_index([10, 0]) == 0.5 and jain_index([]) is None
    assert jain_index([10, 1]) == pytest.approx(121 / 202)


# ---- objectives ----

def test_objectives_parse_json_and_yaml_and_refuse_bad_priorities(tmp_path: Any) -> None:
    spec = {name: {"priority": p} for name, p in OBJECTIVES.items()}
    path = tmp_path / "o.json"
    path.write_text(json.dumps(spec))
    assert load_objectives(str(path)) == OBJECTIVES
    yml = tmp_path / "o.yaml"
    yml.write_text("critical:\n  priority: 10\nbatch:\n  priority: -1\n")
    assert load_objectives(str(yml)) == {"critical": 10, "batch": -1}
    for bad in ([1], {"x": {"priority": "high"}}, {"x": {"priority": True}}, {"": {"priority": 1}},
                {"x": {"priority": 10**9}}):
        with pytest.raises(ObjectivesError):
            parse_objectives(bad)
    objectives = Objectives(OBJECTIVES)
    assert objectives.priority("critical") == 10 and objectives.priority("nope") == DEFAULT_PRIORITY
    assert objectives.priority("") == DEFAULT_PRIORITY
    objectives.set_cluster({"critical": 5})
    assert objectives.priority("critical") == 5 and objectives.priority("batch") == -1


# ---- room ----

def test_room_is_free_batch_slots_once_an_engine_has_shown_its_batch() -> None:
    assert room(4, 0, 5, None, 0) == math.inf  # never queued: its batch size is unknown, fail open
    assert room(8, 2, 0, None, 0) == 0 and room(8, 2, -3, None, 0) == 1  # queueing, own requests ended since
    assert room(8, 2, 0, None, 3) == 1  # may queue 3
    assert room(6, 0, 0, 8, 0) == 2 and room(6, 0, 1, 8, 0) == 1 and room(8, 1, 0, 8, 0) == 0
    assert room(8, 1, 0, 8, 2) == 1  # may queue 2 beyond its batch


def test_an_engines_batch_is_learned_from_a_scrape_that_shows_a_queue() -> None:
    assert learn_slots(None, 5, 0) is None  # no queue: the batch may be larger
    assert learn_slots(None, 8, 3) == 8
    assert learn_slots(8, 6, 2) == 6  # its KV cache limits it now
    assert learn_slots(6, 9, 0) == 9  # ran more without a queue: larger than thought
    assert learn_slots(8, 4, 0) == 8


class Signals:
    def __init__(self, scraped: dict[str, tuple[float, float] | None]) -> None:
        self.scraped = scraped
        self.own: dict[str, int] = {}  # requests sent since the scrape less ended since (the correction)
        self.inflight: dict[str, int] = {}  # the sidecar's own requests in flight

    def fresh_stats(self, endpoint: str, now: float | None = None) -> EngineStats | None:
        st = self.scraped.get(endpoint)
        return None if st is None else EngineStats(running=st[0], waiting=st[1], kv_usage=None, at=0.0)

    def snapshot_correction(self, endpoint: str) -> int:
        return self.own.get(endpoint, 0)

    def count(self, endpoint: str) -> int:
        return self.inflight.get(endpoint, 0)


def test_an_engine_holds_at_least_the_sidecars_own_requests_in_flight() -> None:
    """A scrape taken after two requests finished at the engine but before their ends reached the sidecar shows 6
    running, and the correction subtracts those two ends again: the scrape alone would see 4 free slots of 8. The
    sidecar still has 8 in flight there: none is free."""
    signals = Signals({"a": (6, 0)})
    pool = PoolRoom(signals, lambda: ("a",), set, queue=0)
    pool.scraped("a", 8, 1)  # its batch of 8 is known
    signals.own["a"] = -2
    assert pool.of("a") == 4
    signals.inflight["a"] = 8
    assert pool.of("a") == 0
    signals.inflight["a"] = 7
    assert pool.of("a") == 1


def test_the_pool_has_room_while_any_eligible_endpoint_has_a_free_slot_beyond_the_reserve() -> None:
    signals = Signals({"a": (8, 3), "b": (8, 2)})
    out: set[str] = set()
    pool = PoolRoom(signals, lambda: ("a", "b"), lambda: out, queue=0)
    for ep, (running, waiting) in signals.scraped.items():  # type: ignore[misc]
        pool.scraped(ep, running, waiting)
    assert pool.slots == {"a": 8, "b": 8}
    assert not pool.has_room() and pool.total() == 0 and pool.saturation() == 1.0
    signals.scraped["b"] = (6, 0)
    assert pool.has_room() and pool.total() == 2 and pool.saturation() == 0.5
    assert pool.has_room(reserve=1) and pool.total(reserve=1) == 1 and not pool.has_room(reserve=2)
    out.add("b")  # failing engines are not eligible
    assert not pool.has_room()
    signals.scraped["a"] = None
    assert pool.has_room() and pool.total() == math.inf


def test_the_pools_view_shows_each_engines_room_and_its_inputs() -> None:
    signals = Signals({"a": (8, 1), "b": None})
    signals.inflight["a"], signals.own["a"] = 9, 1
    pool = PoolRoom(signals, lambda: ("a", "b"), set, queue=0)
    pool.scraped("a", 8, 1)
    rows = pool.views(16, now=0.25)
    assert rows == [{"endpoint": "a", "slots": 8, "running": 8, "waiting": 1, "scraped_ago_s": 0.25, "own": 9,
                     "own_since": 1, "room": 0.0},
                    {"endpoint": "b", "slots": None, "running": None, "waiting": None, "scraped_ago_s": None,
                     "own": 0, "own_since": 0, "room": None}]  # no fresh scrape: unbounded, shown as None
    assert [row["endpoint"] for row in pool.views(1, now=0.0)] == ["a"]


# ---- the controller ----

class Room:
    """A pool whose room the test sets."""

    def __init__(self, free: float) -> None:
        self.free = free
        self.slots: dict[str, float] = {}

    def has_room(self, reserve: int = 0) -> bool:
        return self.free > reserve

    def of(self, endpoint: str) -> float:
        return self.free  # one engine

    def total(self, reserve: int = 0) -> float:
        return max(0.0, self.free - reserve)

    def scraped(self, endpoint: str, running: float, waiting: float) -> None:
        pass

    def known_slots(self) -> float:
        return sum(self.slots.values())

    def eligible_count(self) -> int:
        return 1

    def views(self, limit: int, now: float) -> list[dict[str, object]]:
        return [{"endpoint": "a", "room": self.free}][:limit]


def controller(free: float = 0, **settings: Any) -> tuple[AdmissionController, Room]:
    settings.setdefault("reserved_slots", 0)
    pool = Room(free)
    return AdmissionController(AdmissionSettings(**settings), Objectives(OBJECTIVES), pool), pool  # type: ignore[arg-type]


async def test_with_room_a_request_is_admitted_at_once() -> None:
    admission, _ = controller(free=1)
    verdict = await admission.admit("critical", "t", 100)
    assert verdict.admitted and verdict.outcome == "admitted" and verdict.priority == 10 and not verdict.held


async def settle() -> None:
    """Let the loop run what is ready, and what that makes ready, a few hops deep (the pump, a released waiter's
    wake-ups through its wait_for and shield): loop turns, not a timer, so a slow or collecting machine cannot
    end the wait before the chain does."""
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)


SETTLE_TURNS = 20


async def room_appears(admission: AdmissionController, pool: Room, n: int) -> None:
    pool.free = n
    admission.on_ended(None)  # type: ignore[arg-type]
    await settle()  # the pump, then the released waiters' wake-ups


async def test_held_requests_are_released_by_priority_within_the_room_that_appears() -> None:
    admission, pool = controller()
    holds: list[float] = []

    async def on_hold(seconds: float) -> None:
        holds.append(seconds)

    tasks = {name: asyncio.create_task(admission.admit(name, "t", 10, name, on_hold))
             for name in ("batch", "standard", "critical")}
    await settle()
    assert len(admission.queue) == 3 and holds == [30.0] * 3
    await room_appears(admission, pool, 1)
    assert tasks["critical"].done() and not tasks["standard"].done()
    verdict = tasks["critical"].result()
    assert verdict.admitted and verdict.outcome == "released" and verdict.held and verdict.wait_s > 0
    # released, not yet decided: the same room does not release another
    await room_appears(admission, pool, 1)
    assert not tasks["standard"].done()
    admission.settled(verdict)
    await room_appears(admission, pool, 2)
    assert tasks["standard"].result().outcome == "released" and tasks["batch"].result().outcome == "released"
    assert len(admission.queue) == 0


async def test_the_reserved_slots_go_to_the_highest_priority_only() -> None:
    admission, pool = controller(free=1, reserved_slots=1)
    standard = asyncio.create_task(admission.admit("standard", "t", 1))
    await asyncio.sleep(0.01)
    assert not standard.done()  # one free slot, and it is kept for critical
    critical = await asyncio.wait_for(admission.admit("critical", "t", 1), 1)
    assert critical.outcome == "admitted"
    admission.settled(critical)
    await room_appears(admission, pool, 2)
    assert standard.done() and standard.result().outcome == "released"


def test_the_auto_reserve_is_the_fewest_slots_that_keep_the_top_bands_waits_under_its_share() -> None:
    """rho^r <= share: one slot for a band that is a trickle, a few for one with a fifth of the pool."""
    assert top_reserve(0.0, 0.01) == 1 and top_reserve(0.05, 0.01) == 2
    assert top_reserve(0.15, 0.01) == 3 and top_reserve(0.15, 0.05) == 2  # late requests leave fewer
    assert top_reserve(0.5, 0.01) == 7 and top_reserve(5.0, 0.01) == top_reserve(0.95, 0.01)
    reserves = [top_reserve(rho / 100, 0.01) for rho in range(1, 96)]
    assert reserves == sorted(reserves)
    for rho in (0.05, 0.15, 0.3, 0.6):
        r = top_reserve(rho, 0.01)
        assert rho ** r <= 0.01 < rho ** (r - 1) or r == 1


def test_the_top_bands_demand_is_its_in_flight_averaged_over_time() -> None:
    demand = TopDemand(now=0.0, tau_s=10.0)
    demand.set(4, 0.0)
    assert demand.mean(10.0) == pytest.approx(4 * (1 - math.exp(-1)))
    assert demand.mean(200.0) == pytest.approx(4, abs=1e-6)
    demand.set(0, 200.0)
    assert demand.mean(210.0) == pytest.approx(4 * math.exp(-1), rel=1e-6)


async def test_with_the_auto_reserve_lower_bands_leave_the_slots_the_top_bands_demand_needs() -> None:
    now = [0.0]
    pool = Room(free=3)
    pool.slots = {"a": 16.0}
    admission = AdmissionController(AdmissionSettings(), Objectives(OBJECTIVES), pool,  # type: ignore[arg-type]
                                    clock=lambda: now[0])
    settings = admission.state()["settings"]
    assert isinstance(settings, dict) and settings["reserved_slots"] == "auto"
    # No demand from the top band yet: one slot kept, so a lower band may take the others.
    assert admission.state()["reserve_now"] == {"lower": 1, "late": 1}
    standard = await asyncio.wait_for(admission.admit("standard", "t", 1), 1)
    assert standard.outcome == "admitted"
    admission.settled(standard)
    # Three of the top band's requests in flight for a long while on 16 slots: rho = 3/16, so 3 slots kept from
    # a lower band on time (0.1875^3 < 1%) and 2 from a late request (0.1875^2 < 5%).
    decisions = [Decision(str(n), "a", "routed", (), 8, (), (), {}, 0.0) for n in range(3)]
    for decision in decisions:
        top = await asyncio.wait_for(admission.admit("critical", "t", 1), 1)
        admission.settled(top, decision)
    # At once: the average has not caught up yet (a surge, a cold start), the count in flight now sizes it.
    assert admission.state()["top_inflight_mean"] == 0.0 and admission.state()["reserve_now"] == {"lower": 3,
                                                                                                   "late": 2}
    now[0] += 1000.0
    assert admission.state()["top_inflight_mean"] == pytest.approx(3.0)
    assert admission.state()["reserve_now"] == {"lower": 3, "late": 2}
    held = asyncio.create_task(admission.admit("standard", "t", 1))
    await settle()
    assert not held.done()  # three free, all three kept for the top band
    assert (await asyncio.wait_for(admission.admit("critical", "t", 1), 1)).outcome == "admitted"
    admission.settled(Verdict(True, 10, "admitted"))
    await room_appears(admission, pool, 4)
    assert held.done() and held.result().outcome == "released"
    for decision in decisions:  # the top band's requests end: its demand decays, and the reserve with it
        admission.on_ended(decision)
    now[0] += 1000.0
    assert admission.state()["reserve_now"] == {"lower": 1, "late": 1}


async def test_two_backlogged_tenants_share_releases_evenly_at_ten_to_one() -> None:
    admission, pool = controller()
    tasks = [asyncio.create_task(admission.admit("standard", "heavy" if n % 11 else "light", 1, str(n)))
             for n in range(110)]
    await asyncio.sleep(0.01)
    released: list[str] = []
    for _ in range(20):
        await room_appears(admission, pool, 1)
        pool.free = 0
        for n, task in enumerate(tasks):
            if task.done() and str(n) not in released:
                released.append(str(n))
                admission.settled(task.result())
    tenants = ["light" if int(n) % 11 == 0 else "heavy" for n in released]
    assert len(tenants) == 20 and tenants.count("light") == 10  # one turn each while both are backlogged
    # the last heavy release came after the light tenant's last one: no longer contended
    assert admission.contended == {0: {"heavy": 9, "light": 10}}
    assert admission.state()["jain_index"] == {"0": pytest.approx(19 ** 2 / (2 * (81 + 100)))}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert len(admission.queue) == 0  # a stream that ended while held leaves the queue


async def test_past_its_time_to_live_a_sheddable_request_gets_429_and_another_is_placed() -> None:
    admission, _ = controller(ttl_s=0.05, late_s=0.05)
    shed, placed = await asyncio.gather(admission.admit("batch", "t", 1), admission.admit("standard", "t", 1))
    assert not shed.admitted and shed.outcome == "rejected_ttl" and shed.retry_after_s >= 1
    assert placed.admitted and placed.outcome == "placed_ttl" and placed.wait_s >= 0.05
    assert len(admission.queue) == 0


async def test_past_its_time_to_live_a_request_that_is_not_sheddable_may_take_the_reserve() -> None:
    """Held late, it waits for any free slot (the top band's reserve included) rather than being placed into a full
    batch, and a top-band arrival is not held behind it."""
    admission, pool = controller(reserved_slots=1, late_reserved_slots=0, ttl_s=0.05, late_s=5)
    standard = asyncio.create_task(admission.admit("standard", "t", 1))
    await asyncio.sleep(0.1)
    assert not standard.done() and admission.queue.bands() == {0: (1, 1)}  # late, still held in its band
    pool.free = 1
    critical = await asyncio.wait_for(admission.admit("critical", "t", 1), 1)  # the reserved slot: the top band's
    assert critical.outcome == "admitted" and not standard.done()
    admission.settled(critical)
    await room_appears(admission, pool, 1)  # one free slot, the reserve: the late request takes it
    assert standard.done() and standard.result().outcome == "released" and standard.result().wait_s >= 0.05
    assert standard.result().late and not critical.late  # placed as it was released: into any free slot


async def test_with_late_reserved_slots_a_late_request_leaves_the_reserve_to_the_top_band() -> None:
    """--late-reserved-slots 1 of --reserved-slots 1: held late, a request takes a free slot beyond the reserve
    only, and an engine whose only free slot is the reserve is no room for it."""
    admission, pool = controller(reserved_slots=1, late_reserved_slots=1, ttl_s=0.05, late_s=5)
    standard = asyncio.create_task(admission.admit("standard", "t", 1))
    await asyncio.sleep(0.1)
    await room_appears(admission, pool, 1)  # the reserve only: kept for the top band
    assert not standard.done() and admission.queue.bands() == {0: (1, 1)}
    await room_appears(admission, pool, 2)  # one beyond the reserve: the late request's
    verdict = standard.result()
    assert verdict.outcome == "released" and verdict.late
    pool.free = 1
    assert not admission.room_for(verdict)("e") and admission.room_for(Verdict(True, 10, "admitted"))("e")
    pool.free = 2
    assert admission.room_for(verdict)("e")


async def test_a_full_queue_evicts_a_lower_sheddable_request_or_sheds_or_places() -> None:
    admission, _ = controller(max_held=2, ttl_s=5)
    held = [asyncio.create_task(admission.admit("batch", "t", 1)) for _ in range(2)]
    await asyncio.sleep(0.01)
    critical = asyncio.create_task(admission.admit("critical", "t", 1))
    await asyncio.sleep(0.01)
    evicted = [t.result() for t in held if t.done()]
    assert [v.outcome for v in evicted] == ["evicted"] and not evicted[0].admitted
    assert (await admission.admit("batch", "t", 1)).outcome == "rejected_queue_full"
    # a standard arrival evicts the batch request left; it is held in its place
    standard = asyncio.create_task(admission.admit("standard", "t", 1))
    await asyncio.sleep(0.01)
    assert all(t.done() for t in held) and [t.result().outcome for t in held] == ["evicted", "evicted"]
    assert not standard.done() and admission.queue.bands() == {10: (1, 1), 0: (1, 1)}
    # full of requests that are not sheddable: a third is placed at once
    assert (await admission.admit("standard", "t", 1)).outcome == "placed_full"
    for t in (standard, critical):
        t.cancel()
    await asyncio.gather(standard, critical, return_exceptions=True)
    assert len(admission.queue) == 0


async def test_the_bound_holds_while_holds_are_being_announced() -> None:
    """A BUFFERED hold first tells Envoy (an await): arrivals meanwhile count the request being held."""
    admission, _ = controller(max_held=2, ttl_s=5)
    most = 0

    async def on_hold(seconds: float) -> None:
        nonlocal most
        await asyncio.sleep(0.001)  # the reply to Envoy on its way
        most = max(most, len(admission.queue))

    tasks = [asyncio.create_task(admission.admit("standard", "t", 1, str(n), on_hold)) for n in range(5)]
    await asyncio.sleep(0.05)
    assert most == 2 and len(admission.queue) == 2
    assert sorted(t.result().outcome for t in tasks if t.done()) == ["placed_full"] * 3
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert len(admission.queue) == 0


async def test_bytes_bound_the_queue_like_requests() -> None:
    admission, _ = controller(max_held_bytes=100, ttl_s=5)
    first = asyncio.create_task(admission.admit("standard", "t", 80))
    await asyncio.sleep(0.01)
    placed = await admission.admit("standard", "t", 30)  # would pass the bytes bound, nothing to evict
    assert placed.admitted and placed.outcome == "placed_full"
    assert (await admission.admit("batch", "t", 30)).outcome == "rejected_queue_full"
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)


async def test_admission_fails_open_when_the_pool_cannot_say() -> None:
    class Broken:
        def has_room(self) -> bool:
            raise RuntimeError("boom")

    admission = AdmissionController(AdmissionSettings(), Objectives(), Broken())  # type: ignore[arg-type]
    verdict = await admission.admit("", "", 1)
    assert verdict.admitted and verdict.outcome == "admitted"


# ---- through the ext_proc conversations ----

def saturated_app(*flags: str) -> Sidecar:
    app = Sidecar(from_args(["--endpoints", "127.0.0.2:8000,127.0.0.3:8000", "--metrics-listen", "off",
                             "--policy", "leastload", "--admission", "on", "--admission-ttl-s", "0.2", *flags],
                            environ={}))
    for ep in app.registry.snapshot():
        app.loads.record(ep, EngineStats(running=8, waiting=4, kv_usage=0.9, at=app.loads.clock()))
    return app


def with_objective(messages: list[Any], objective: str) -> list[Any]:
    messages[0].request_headers.headers.headers.append(
        base_pb2.HeaderValue(key="x-gateway-inference-objective", raw_value=objective.encode()))
    return messages


def body() -> bytes:
    return json.dumps({"model": "m", "prompt": "hello", "max_tokens": 4}).encode()


@pytest.mark.parametrize("mode", ["buffered", "duplex"])
async def test_a_shed_request_gets_429_with_retry_after_and_a_reason(mode: str, tmp_path: Any) -> None:
    path = tmp_path / "objectives.json"
    path.write_text(json.dumps({n: {"priority": p} for n, p in OBJECTIVES.items()}))
    app = saturated_app("--objectives", str(path))
    messages = buffered_messages(body()) if mode == "buffered" else duplex_messages(body())
    feed = Recorder(with_objective(messages, "batch"))
    await app.extproc.process(None, feed)
    kinds = [r.WhichOneof("response") for r in feed.sent]
    if mode == "buffered":  # Envoy's timer is extended before the hold: TTL + 5 s
        assert kinds[:2] == ["request_headers", None]
        assert feed.sent[1].override_message_timeout.ToTimedelta().total_seconds() == pytest.approx(5.2)
    immediate = feed.sent[-1].immediate_response
    assert kinds[-1] == "immediate_response" and immediate.status.code == 429
    headers = {h.header.key: h.header.raw_value.decode() for h in immediate.headers.set_headers}
    assert int(headers["retry-after"]) >= 1
    assert headers["x-loadaware-request-dropped-reason"] == "rejected_ttl"
    assert app.decider.lifecycle is app.lifecycle and app.admission is not None and len(app.admission.queue) == 0


@pytest.mark.parametrize("mode", ["buffered", "duplex"])
async def test_a_held_request_is_routed_once_room_appears(mode: str) -> None:
    app = saturated_app("--admission-ttl-s", "5")
    messages = buffered_messages(body()) if mode == "buffered" else duplex_messages(body())
    feed = Recorder(with_objective(messages, "standard"))
    task = asyncio.create_task(app.extproc.process(None, feed))
    await asyncio.sleep(0.1)
    assert not task.done() and app.admission is not None and len(app.admission.queue) == 1
    ep = app.registry.snapshot()[0]
    app.loads.record(ep, EngineStats(running=6, waiting=0, kv_usage=0.5, at=app.loads.clock()))  # a scrape: room
    await asyncio.wait_for(task, 2)
    routed = [r for r in feed.sent if r.WhichOneof("response") in ("request_headers", "request_body")
              and (r.request_headers.response.header_mutation.set_headers
                   or r.request_body.response.header_mutation.set_headers)]
    assert routed, [r.WhichOneof("response") for r in feed.sent]
    decision = app.recent.last(1)[0].as_dict()
    assert decision["endpoint"] == ep and decision["admission_wait_ms"] > 50


async def test_explain_says_what_admission_would_do_and_changes_nothing(tmp_path: Any) -> None:
    path = tmp_path / "objectives.json"
    path.write_text(json.dumps({n: {"priority": p} for n, p in OBJECTIVES.items()}))
    app = saturated_app("--objectives", str(path))
    request = v1.ExplainRequest(raw_body=body().decode(), objective="batch")
    reply = await app.api.Explain(request, None)
    view = reply.admission
    assert view.enabled and view.priority == -1 and view.sheddable and view.would_hold
    assert view.held == 0 and view.pool_saturation == 1.0
    assert reply.outcome == "routed"  # the decision the request would get once released
    ep = app.registry.snapshot()[0]
    app.loads.record(ep, EngineStats(running=6, waiting=0, kv_usage=0.5, at=app.loads.clock()))
    critical = (await app.api.Explain(v1.ExplainRequest(raw_body=body().decode(), objective="critical"), None))
    assert not critical.admission.would_hold and critical.admission.priority == 10
    assert app.admission is not None and len(app.admission.queue) == 0
    plain = Sidecar(from_args(["--endpoints", "127.0.0.2:8000", "--metrics-listen", "off"], environ={}))
    assert not (await plain.api.Explain(request, None)).admission.enabled


async def test_each_hold_of_the_top_band_keeps_its_cause_the_pool_and_its_wait() -> None:
    admission, pool = controller()
    first = asyncio.create_task(admission.admit("critical", "t", 1))
    await settle()
    second = asyncio.create_task(admission.admit("critical", "t", 1))  # behind the first, in its band
    gone = asyncio.create_task(admission.admit("critical", "t", 1))
    standard = asyncio.create_task(admission.admit("standard", "t", 1))  # a lower band's hold is not kept
    await settle()
    gone.cancel()
    await settle()
    await room_appears(admission, pool, 1)
    verdict = first.result()
    state = admission.state()["top_holds"]
    assert isinstance(state, dict) and state["by_cause"] == {"no_room": 1, "behind_top": 2}
    holds = state["last"]
    assert [h["cause"] for h in holds] == ["no_room", "behind_top", "behind_top"]
    assert holds[0]["engines"] == [{"endpoint": "a", "room": 0}] and holds[0]["pending"] == 0
    assert holds[0]["outcome"] == "released" and holds[0]["waited_s"] == round(verdict.wait_s, 4)
    assert holds[1]["outcome"] == "" and holds[1]["waited_s"] is None  # still held
    assert holds[2]["outcome"] == "left" and holds[2]["waited_s"] >= 0
    admission.settled(verdict)
    await room_appears(admission, pool, 2)
    assert second.result().outcome == "released" and admission.top_holds.kept[1].outcome == "released"
    assert standard.done()


async def test_a_top_band_hold_with_free_slots_promised_to_admitted_requests_is_told_as_pending() -> None:
    admission, _ = controller(free=1)
    admitted = await admission.admit("standard", "t", 1)  # takes the one free slot, not yet decided
    assert admitted.outcome == "admitted"
    top = asyncio.create_task(admission.admit("critical", "t", 1))
    await settle()
    assert admission.top_holds.by_cause == {"pending": 1}
    admission.settled(admitted)
    admission.on_ended(None)  # type: ignore[arg-type]
    await settle()
    assert top.result().outcome == "released"


async def test_the_wait_floor_is_unknown_until_the_pool_and_the_top_band_are_seen_then_read_from_them() -> None:
    now = [0.0]
    pool = Room(free=100)  # every request admitted at once: the floor counts arrivals, not what admission did
    admission = AdmissionController(AdmissionSettings(), Objectives(OBJECTIVES), pool,  # type: ignore[arg-type]
                                    clock=lambda: now[0])
    assert math.isnan(admission.top_wait_floor())
    pool.slots = {"a": 4.0}
    decisions = [Decision(str(n), "a", "routed", (), 8, (), (), {}, 0.0) for n in range(2)]
    for decision in decisions:  # two of the top band in flight
        admission.settled(await admission.admit("critical", "t", 1), decision)
    for _ in range(2):
        admission.settled(await admission.admit("standard", "t", 1))
    for _ in range(4):
        batch = await asyncio.wait_for(admission.admit("batch", "t", 1), 1)  # sheddable: not among the kept bands
        assert batch.outcome == "admitted"
    now[0] += 30.0
    # 2 kept arrivals per top one, 2 of the top band in flight: 4 of the 4 slots needed, none left free
    state = admission.state()["top_wait_floor"]
    assert isinstance(state, dict) and state["kept_per_top_arrival"] == 2.0 and state["floor"] == 1.0
    assert admission.top_wait_floor() == 1.0
    pool.slots = {"a": 8.0}  # twice the slots: 4 free, rho 2/8
    assert admission.top_wait_floor() == pytest.approx(0.25 ** 4)
