"""A floored policy (lane-spread, Needs.floored) over a large pool scores its holders, the endpoints it must
score, and the rest in load order only until the cost floor passes the best costs found
(policies/floored_scan.py); it must rank exactly what scoring every endpoint ranks.

Two deciders share one load tracker, registry, signal tracker, working set and queued-prompt index: one with
the load order (the scan), one scoring every endpoint. Randomized, seeded: counted decisions book the prefill
clocks and loads, first chunks teach the clocks' TTFT models (learned prices that vary per endpoint, within
their bounds), scrapes bring queues (queued-prefix credit and the waiting term; now and then on every engine,
when the policy chooses as loadaware) and a KV capacity (the working set's demand, so the policy spreads once a
prefix is popular), the clock advances, requests end, the fleet
changes, and 0-4 fallbacks are asked for."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Collection, Sequence

import pytest

from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.load.order import LoadOrder
from loadaware.load.signals import SignalTracker
from loadaware.load.tracker import EngineStats, LoadTracker
from loadaware.policies import Candidate, make_policy
from loadaware.policies.floored_scan import Bound, FlooredScan
from loadaware.policies.lane_spread import ALL_QUEUEING, LaneSpread
from loadaware.policies.ttft_model import TtftPrior
from loadaware.prefix.working_set import WorkingSet
from loadaware.routing.builder import build_decider
from loadaware.routing.request import InferenceRequest
from tests.unit.test_pruning import Fixed

STEPS = 700


class Joins:
    def __init__(self, tracker: LoadTracker, signals: SignalTracker) -> None:
        self.tracker, self.signals = tracker, signals

    def on_added(self, endpoint: str) -> None:
        self.tracker.join(endpoint)

    def on_removed(self, endpoint: str) -> None:
        self.tracker.drop(endpoint)
        self.signals.drop(endpoint)

    def on_changed(self, endpoints: tuple[str, ...]) -> None:
        pass


def prompt_of(family: int, i: int) -> list[int]:
    return [1000 * (family + 1) + t for t in range(256)] + [7, family, i % 5]


def test_the_floored_scan_ranks_as_scoring_every_endpoint() -> None:
    rng = random.Random("floored")
    now = [1000.0]
    tracker = LoadTracker(stale_s=2.0, clock=lambda: now[0])
    signals = SignalTracker(clock=lambda: now[0])
    eps = [f"10.0.{i // 250}.{i % 250 + 1}:8000" for i in range(120)]
    rng.shuffle(eps)
    registry = EndpointRegistry(eps)
    for ep in eps:
        tracker.join(ep)
    registry.subscribe(Joins(tracker, signals))
    lifecycle = RequestLifecycle()
    lifecycle.subscribe(tracker)
    lifecycle.subscribe(signals)
    lifecycle.subscribe_progress(signals)
    source = Fixed()
    working_set = WorkingSet()
    scan = build_decider(make_policy("lane-spread", 1.0), registry, tracker, lifecycle, prefix_source=source,
                   fallbacks=2, ranking=tracker, signals=signals, working_set=working_set)
    full = build_decider(make_policy("lane-spread", 1.0), registry, tracker, RequestLifecycle(), prefix_source=source,
                   fallbacks=2, signals=signals, working_set=working_set)
    full.data.queued = scan.data.queued  # one index of queued prompts, held by the counted decisions
    seen = {"pruned": 0, "spread": 0, "learned": 0, "credited": 0, "queueing": 0, "all_queueing": 0}
    open_decisions: list[Decision] = []
    queueing = eps[:8]  # engines whose scrapes show an admission queue now and then

    async def run() -> None:
        for step in range(STEPS):
            roll = rng.random()
            if roll < 0.3:
                ep = rng.choice(queueing if rng.random() < 0.7 else registry.snapshot())
                waiting = rng.choice((0, 1, 4)) if ep in queueing else 0
                tracker.record(ep, EngineStats(rng.randrange(6), waiting, 0.5, now[0],
                                               kv_capacity_tokens=50_000.0))
            elif roll < 0.4:
                now[0] += rng.choice((0.001, 0.02, 0.2, 1.0, 3.0))  # clocks drain, some scrapes go stale
            elif roll < 0.42:
                kept = [ep for ep in eps if rng.random() < 0.95]
                registry.set(kept or eps)
            elif roll < 0.44:  # every engine queues (lane-spread chooses as loadaware) until scrapes go stale
                for ep in registry.snapshot():
                    tracker.record(ep, EngineStats(rng.randrange(6), rng.choice((1, 4)), 0.5, now[0],
                                                   kv_capacity_tokens=50_000.0))
            if open_decisions and rng.random() < 0.5:
                d = open_decisions[rng.randrange(len(open_decisions))]
                if not d.first_chunk and rng.random() < 0.7:
                    now[0] += rng.uniform(0.0, 0.05)
                    lifecycle.first_chunk(d)  # teaches the clock when decided idle
                else:
                    open_decisions.remove(d)
                    lifecycle.ended(d)
            family = rng.choice((0, 0, 0, 1, 2))
            live = registry.snapshot()
            holders = rng.sample(live, rng.choice((0, 1, 2, 5))) + [ep for ep in queueing if ep in live][:2]
            source.answer = {ep: rng.choice((16, 128, 256)) for ep in holders}
            fallbacks = rng.randrange(5)
            scan.selection.limit = full.selection.limit = 1 + fallbacks
            request = InferenceRequest(kind="completions", model=None, prompt=prompt_of(family, step))
            want = await full.decide(request, f"full-{step}", count=False)
            got = await scan.decide(request, f"scan-{step}")
            assert got.ranked == want.ranked, f"step {step}"
            assert got.reasons == want.reasons, f"step {step}"
            assert got.pool_size == want.pool_size
            scores = dict(zip((c.endpoint for c in want.candidates), want.scores))
            for c, score in zip(got.candidates, got.scores):
                assert score == scores[c.endpoint], f"step {step}: {c.endpoint}"
            seen["pruned"] += len(got.candidates) < len(want.candidates) // 2
            seen["spread"] += got.candidates[0].prefix_routes >= got.pool_size and \
                (got.candidates[0].cache_demand or 1.0) < 1.0
            seen["learned"] += any(c.idle_ttft_per_token_s is not None for c in want.candidates)
            seen["credited"] += any(c.queued_tokens > 0 for c in got.candidates)
            seen["queueing"] += any(c.waiting > 0 for c in want.candidates)
            assert got.rule == want.rule, f"step {step}"
            seen["all_queueing"] += got.rule == ALL_QUEUEING
            open_decisions.append(got)

    asyncio.run(run())
    # The randomized states reached what the scan must get right, and the scan pruned.
    assert all(n > 10 for n in seen.values()), seen


def test_the_scan_stops_where_the_floor_passes_the_best_costs() -> None:
    """Idle endpoints at the prior's prices cost exactly the floor at load 0: after the `limit` cheapest, the
    scan stops at the next one (it would lose the tie on its name)."""
    policy = LaneSpread()
    order = LoadOrder()
    eps = [f"e{i:03d}" for i in range(200)]
    for i, ep in enumerate(eps):
        order.set(ep, float(i % 4))
    built: list[str] = []

    def build(ep: str, load: float) -> Candidate:
        built.append(ep)
        return Candidate(ep, 0, load)

    def cost(c: Candidate) -> float:
        return policy.cost_in(100, c, False)

    def floor(load: float) -> float:
        return policy.floor(100, load, TtftPrior().prices(), False)

    rest, costs = scan(order, (), eps, [], [], 3, build, cost, floor)
    assert [c.endpoint for c in rest] == built == ["e000", "e004", "e008"]
    assert costs == [floor(0.0)] * 3
    # A holder cheaper than any idle endpoint leaves only the `limit` - 1 others to find.
    holder = Candidate("e199", 100, 3.0)
    rest, _ = scan(order, {"e199"}, eps, [holder], [cost(holder)], 3, build, cost, floor)
    assert [c.endpoint for c in rest] == ["e000", "e004"]


def scan(order: LoadOrder, leave: Collection[str], eps: Collection[str], scored: list[Candidate],
         scored_costs: list[float], limit: int, build: Callable[[str, float], Candidate],
         cost: Callable[[Candidate], float], floor: Callable[[float], float], bound: Bound | None = None
         ) -> tuple[list[Candidate], list[float]]:
    """The floored scan over `order`, choosing among `eps`."""
    return FlooredScan(leave, eps.__contains__, limit, build, cost, floor).run(scored, scored_costs, order.by_load(),
                                                                               bound)


def taught(lifecycle: RequestLifecycle, endpoint: str, ttft_s: float, now: list[float], n: int) -> None:
    """n requests on `endpoint`, each decided on its idle clock and answered after ttft_s: its prices learn."""
    for i in range(n):
        d = Decision(f"teach-{endpoint}-{i}", endpoint, "routed", (), 200, (Candidate(endpoint, 0, 0.0),), (0.0,),
                     {}, 0.0)
        lifecycle.decided(d)
        now[0] += ttft_s
        lifecycle.first_chunk(d)
        lifecycle.ended(d)
        now[0] += 1.0  # its clock drains: the next one is decided idle too


def test_an_endpoint_that_learned_it_is_fast_is_found_behind_the_idle_ones() -> None:
    """Every endpoint idle at the prior's prices but one, busier, that learned it prefills twice as fast: it
    costs least although the scan meets it last; the scan scores it because it learned since a scan last read
    it, and later scans because the price floor took its prices in (and so visit every endpoint whose floor is
    below its cost: a fleet whose learned prices differ prunes less)."""
    now = [1000.0]
    tracker = LoadTracker(stale_s=2.0, clock=lambda: now[0])
    signals = SignalTracker(clock=lambda: now[0])
    eps = [f"10.0.0.{i + 1}:8000" for i in range(100)]
    fast = eps[-1]
    registry = EndpointRegistry(eps)
    for ep in eps:
        tracker.join(ep)
    lifecycle = RequestLifecycle()
    for listener in (tracker, signals):
        lifecycle.subscribe(listener)
    lifecycle.subscribe_progress(signals)
    taught(lifecycle, fast, 0.001, now, 12)
    for ep in (*eps[-10:], *eps[:3]):  # a request in flight on each: `fast` is the last in load order, and the
        # pile-up guard leaves it eligible
        lifecycle.decided(Decision(f"busy-{ep}", ep, "routed", (), 10, (Candidate(ep, 0, 0.0),), (0.0,), {}, 0.0))
    now[0] += 1.0
    scan = build_decider(make_policy("lane-spread", 1.0), registry, tracker, lifecycle, prefix_source=Fixed(),
                   ranking=tracker, signals=signals)
    full = build_decider(make_policy("lane-spread", 1.0), registry, tracker, RequestLifecycle(), prefix_source=Fixed(),
                   signals=signals)
    request = InferenceRequest(kind="completions", model=None, prompt=list(range(2000)))

    async def both() -> tuple[Decision, Decision]:
        return (await scan.decide(request, "scan", count=False), await full.decide(request, "full", count=False))

    for _ in range(2):  # the first scan reads its new prices, the second bounds it by the floor
        got, want = asyncio.run(both())
        assert want.endpoint == fast and got.ranked == want.ranked
    assert fast not in signals.unread()


def test_the_price_floor_is_the_lowest_read_and_rises_after_a_refresh() -> None:
    now = [0.0]
    signals = SignalTracker(clock=lambda: now[0])
    lifecycle = RequestLifecycle()
    lifecycle.subscribe(signals)
    lifecycle.subscribe_progress(signals)
    prior = TtftPrior()
    assert signals.price_floor(prior.prices()) == prior.prices()
    taught(lifecycle, "a", 0.001, now, 12)
    taught(lifecycle, "b", 0.5, now, 12)
    assert signals.unread() == {"a", "b"}

    def read(ep: str) -> Candidate:
        lane_wait, base, per_token, per_running = signals.get(ep).prefill_clock.view(now[0])  # type: ignore[union-attr]
        return Candidate(ep, 0, 0.0, lane_wait_s=lane_wait, idle_ttft_base_s=base, idle_ttft_per_token_s=per_token,
                         idle_ttft_per_running_s=per_running)

    a, b = read("a"), read("b")
    signals.read([a, b])
    assert not signals.unread()
    floor = signals.price_floor(prior.prices())
    assert floor[0] == min(prior.base_s, a.idle_ttft_base_s, b.idle_ttft_base_s)  # type: ignore[type-var]
    assert floor[1] == min(prior.per_token_s, a.idle_ttft_per_token_s,  # type: ignore[type-var]
                           b.idle_ttft_per_token_s)
    assert floor[0] < prior.base_s
    assert signals.read_prices("a") == (a.idle_ttft_base_s, a.idle_ttft_per_token_s, a.idle_ttft_per_running_s)
    # "a" slows down: until it is read again it is unread (a scan scores it), and once read, the floor rises to
    # the lowest read prices at the next refresh.
    taught(lifecycle, "a", 0.5, now, 40)
    assert signals.unread() == {"a"}
    signals.read([read("a")])
    now[0] += 31.0
    bases = [read(ep).idle_ttft_base_s for ep in ("a", "b")]
    assert signals.price_floor(prior.prices())[0] == min(prior.base_s, *(b for b in bases if b is not None)) > floor[0]


def scan_case(rng: random.Random, with_bounds: bool) -> tuple[set[str], set[str]]:
    """One synthetic pool: (the `limit` best endpoints by (cost, load, name), the endpoints the scan built)."""
    n = rng.randrange(2, 120)
    eps = [f"e{i:03d}" for i in range(n)]
    load = {ep: float(rng.choice((0, 0, 0, 1, 2))) for ep in eps}
    own = {ep: rng.choice((1.0, 1.0, 1.0005, 1.2, 2.0)) + load[ep] for ep in eps}  # its floor
    true = {ep: own[ep] + rng.choice((0.0, 0.0, 0.0003, 0.5)) for ep in eps}  # its cost
    order = LoadOrder()
    for ep in eps:
        order.set(ep, load[ep])
    limit = rng.randrange(1, 4)

    def floor(at_load: float) -> float:
        return min((own[ep] for ep in eps if load[ep] >= at_load), default=99.0)

    def bound(at_load: float) -> Callable[[Sequence[str], float], list[tuple[float, str]]]:
        return lambda names, kth: [(own[ep], ep) for ep in names if own[ep] <= kth]

    def build(ep: str, at_load: float) -> Candidate:
        return Candidate(ep, 0, at_load)

    rest, costs = scan(order, (), eps, [], [], limit, build, lambda c: true[c.endpoint], floor,
                       bound if with_bounds else None)
    assert costs == [true[c.endpoint] for c in rest]
    ranking = sorted(eps, key=lambda ep: (true[ep], load[ep], ep))
    return set(ranking[:limit]), {c.endpoint for c in rest}


@pytest.mark.parametrize("with_bounds", [False, True])
def test_the_scan_keeps_every_endpoint_that_ranks(with_bounds: bool) -> None:
    """Synthetic costs with many ties and near-ties: whatever the scan leaves out ranks after the `limit` best
    (by cost, then load, then name), for the in-order stop and for the bound-weighed one."""
    rng = random.Random(f"keys-{with_bounds}")
    for case in range(300):
        best, built = scan_case(rng, with_bounds)
        assert best <= built, f"case {case}"


def test_the_floor_never_rounds_above_a_cost_and_the_bounds_are_the_floor() -> None:
    """A near-tie at the prior's prices once left an endpoint out: the bound, summed in another order than the
    cost, rounded 1 ulp above it. The floor is summed in the cost's order, so it is at most the cost exactly."""
    rng = random.Random("rounding")
    policy = LaneSpread()
    for _ in range(3000):
        prices = (rng.uniform(0.001, 0.1), rng.uniform(1e-5, 1e-3), rng.uniform(1e-4, 0.01))
        n, load, spread = rng.randrange(1, 20_000), float(rng.randrange(0, 70)), rng.random() < 0.5
        c = Candidate("e", 0, load, decode_batch=float(rng.randrange(0, 64)), idle_ttft_base_s=prices[0],
                      idle_ttft_per_token_s=prices[1], idle_ttft_per_running_s=prices[2])
        floor = policy.floor(n, load, prices, spread)
        assert floor <= policy.cost_in(n, c, spread)
        c.decode_batch = 0.0
        assert floor == policy.cost_in(n, c, spread)  # idle clock, empty batch, no queue: the floor is the cost
        assert policy.bounds(n, load, spread, ["e", "f"], {"e": prices}.get, prices, floor) == \
            [(floor, "e"), (floor, "f")]
