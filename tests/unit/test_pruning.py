"""Pruned candidates (routing/pruning.py) choose what the full pool chooses: the same choice, the same ranked
fallbacks and the same scores, for every policy that declares Needs.prunable; through the decider too, with real
counts.

Randomized over many seeded cases: fleets of 64-400 endpoints in shuffled order, loads with many ties
(small integers and halves), holders with matches short of, equal to and beyond the prompt, pools that are
the whole fleet or a part of it, 0-5 fallbacks, several betas."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest

from loadaware.fleet.health import EndpointHealth, HealthOptions
from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.load.order import LoadOrder
from loadaware.load.tracker import EngineStats, LoadTracker
from loadaware.policies import POLICIES, Candidate, make_policy, ranked
from loadaware.routing.builder import build_decider
from loadaware.routing.pruning import MIN_POOL, pruned_candidates
from loadaware.routing.request import InferenceRequest

CASES = 400

PRUNABLE = sorted(name for name, make in POLICIES.items() if make(1.0).needs.prunable)


def fleet(rng: random.Random, n: int) -> list[str]:
    eps = [f"10.0.{i // 250}.{i % 250 + 1}:{rng.choice((8000, 8001))}" for i in range(n)]
    rng.shuffle(eps)  # discovery's order is not lexical
    return eps


def random_loads(rng: random.Random, eps: Sequence[str]) -> dict[str, float]:
    spread = rng.choice((1, 3, 8, 40))
    return {ep: rng.randrange(spread * 2) / 2 for ep in eps}


def random_matches(rng: random.Random, eps: Sequence[str], prompt: int) -> dict[str, int]:
    holders = rng.sample(list(eps), rng.choice((0, 1, 3, 10, len(eps) // 3)))
    return {ep: rng.choice((0, 16, 32, prompt // 2, prompt, prompt + 32)) for ep in holders}


def full_ranking(policy_name: str, beta: float, pool: Sequence[str], loads: dict[str, float],
                 matches: dict[str, int], prompt: int, limit: int) -> tuple[list[str], dict[str, float]]:
    policy = make_policy(policy_name, beta)
    candidates = tuple(Candidate(ep, min(matches.get(ep, 0), prompt), loads[ep]) for ep in pool)
    choice = policy.choose(prompt, candidates)
    assert choice is not None
    return ([candidates[i].endpoint for i in ranked(choice, candidates, limit)],
            {c.endpoint: s for c, s in zip(candidates, choice.scores)})


@pytest.mark.parametrize("policy_name", PRUNABLE)
def test_pruned_candidates_rank_as_the_full_pool(policy_name: str) -> None:
    rng = random.Random(f"pruning-{policy_name}")
    for case in range(CASES):
        eps = fleet(rng, rng.randrange(MIN_POOL, 400))
        loads = random_loads(rng, eps)
        prompt = rng.choice((16, 160, 1600))
        whole = rng.random() < 0.6
        pool = tuple(eps) if whole else tuple(ep for ep in eps if rng.random() < 0.7)
        matches = random_matches(rng, eps, prompt)  # holders outside the pool too: they must not count
        limit = 1 + rng.randrange(6)
        beta = rng.choice((0.0, 0.5, 1.0, 3.0))
        excluded = frozenset(rng.sample(pool, rng.choice((0, 0, 1, 3))))  # engines failing their requests
        eligible = tuple(ep for ep in pool if ep not in excluded)
        order = LoadOrder()
        for ep in eps:
            order.set(ep, loads[ep])
        position = {ep: i for i, ep in enumerate(eps)}.__getitem__
        pruned, mean = pruned_candidates(order, pool, frozenset(pool), whole, matches, prompt, limit, position,
                                         excluded)
        assert mean == pytest.approx(sum(loads[ep] for ep in eligible) / len(eligible))
        policy = make_policy(policy_name, beta)
        choice = policy.choose(prompt, pruned, mean)
        assert choice is not None
        got = [pruned[i].endpoint for i in ranked(choice, pruned, limit)]
        want, want_scores = full_ranking(policy_name, beta, eligible, loads, matches, prompt, limit)
        assert got == want, f"case {case}: pool of {len(pool)}, limit {limit}, beta {beta}"
        for c, score in zip(pruned, choice.scores):
            assert score == pytest.approx(want_scores[c.endpoint], abs=1e-12), f"case {case}: {c.endpoint}"
        # Proportional to the holders plus the few least loaded, not to the pool.
        assert len(pruned) <= len([ep for ep in eligible if matches.get(ep, 0) > 0]) + limit
        assert not excluded & {c.endpoint for c in pruned}


def test_the_load_order_follows_updates_and_ties_break_lexically() -> None:
    rng = random.Random(7)
    order = LoadOrder()
    truth: dict[str, float] = {}
    eps = [f"10.0.0.{i}:8000" for i in range(1, 120)]
    for _ in range(5000):
        ep = rng.choice(eps)
        if rng.random() < 0.1:
            order.discard(ep)
            truth.pop(ep, None)
        else:
            truth[ep] = rng.randrange(6)
            order.set(ep, truth[ep])
    assert list(order.ascending()) == sorted((load, ep) for ep, load in truth.items())
    assert order.total == sum(truth.values()) and len(order) == len(truth)
    skip = set(rng.sample(sorted(truth), 20))
    assert order.least(5, skip.__contains__) == [ep for _, ep in sorted((v, e) for e, v in truth.items())
                                                  if ep not in skip][:5]


class Fixed:
    name = "fixed"

    def __init__(self) -> None:
        self.answer: dict[str, int] = {}

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        return {ep: n for ep, n in self.answer.items() if ep in endpoints}


@pytest.mark.parametrize("policy_name", [*PRUNABLE, "roundrobin"])
def test_the_decider_with_a_load_order_decides_as_without(policy_name: str) -> None:
    """Two deciders on one tracker, registry, health and source, one pruning (ranking=the tracker), one scoring
    every endpoint: every decision ranks the same endpoints, while counts, scrapes (fresh and stale), fleet
    changes and engines failing (ejected, then probing) move the loads and the pool under them. Round robin
    takes its own path (the turn's endpoint in the fleet's lexical order, the least loaded after it)."""
    rng = random.Random(f"decider-{policy_name}")
    now = [1000.0]
    tracker = LoadTracker(stale_s=2.0, clock=lambda: now[0])
    eps = fleet(rng, 150)
    registry = EndpointRegistry(eps)
    for ep in eps:
        tracker.join(ep)
    registry.subscribe(_Joins(tracker))
    lifecycle = RequestLifecycle()
    lifecycle.subscribe(tracker)
    source = Fixed()
    policy = make_policy(policy_name, 1.0)
    health = EndpointHealth(HealthOptions(failures_to_eject=1, base_ejection_s=2.0), clock=lambda: now[0])
    registry.on_removed(health.forget)
    pruning = build_decider(policy, registry, tracker, lifecycle, prefix_source=source, fallbacks=3, ranking=tracker,
                      health=health)
    full = build_decider(make_policy(policy_name, 1.0), registry, tracker, RequestLifecycle(), prefix_source=source,
                   fallbacks=3, health=health)
    open_decisions: list[Decision] = []
    prompt = list(range(160))

    async def run() -> None:
        for step in range(300):
            roll = rng.random()
            if roll < 0.1:
                ep = rng.choice(registry.snapshot())
                tracker.record(ep, EngineStats(rng.randrange(8), rng.randrange(3), None, now[0]))
            elif roll < 0.15:
                now[0] += rng.choice((0.5, 1.5, 3.0))  # some scrapes go stale
            elif roll < 0.18:
                kept = [ep for ep in eps if rng.random() < 0.9]
                registry.set(kept or eps)
            elif roll < 0.25:
                health.failed(rng.choice(registry.snapshot()), "http_5xx")  # ejected until its backoff ends
            elif roll < 0.28:
                health.succeeded(rng.choice(registry.snapshot()))
            elif roll < 0.4 and open_decisions:
                lifecycle.ended(open_decisions.pop(rng.randrange(len(open_decisions))))
            source.answer = random_matches(rng, registry.snapshot(), 160)
            request = InferenceRequest(kind="completions", model=None, prompt=prompt)
            want = await full.decide(request, f"full-{step}", count=False)
            got = await pruning.decide(request, f"pruned-{step}")
            assert got.ranked == want.ranked, f"step {step}"
            assert got.pool_size == want.pool_size == len(full.candidates(None, None, []))
            assert got.reasons == want.reasons
            open_decisions.append(got)

    asyncio.run(run())


class _Joins:
    def __init__(self, tracker: LoadTracker) -> None:
        self.tracker = tracker

    def on_added(self, endpoint: str) -> None:
        self.tracker.join(endpoint)

    def on_removed(self, endpoint: str) -> None:
        self.tracker.drop(endpoint)

    def on_changed(self, endpoints: tuple[str, ...]) -> None:
        pass
