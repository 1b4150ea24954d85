"""The scoring arithmetic, exhaustively. Policies are pure functions of the prompt length and the candidates
(no I/O, no clocks: docs/architecture.md, "The request's path"), so every rule is checked here on plain values."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from loadaware.policies import Candidate, KvAware, LeastLoad, LoadAware, RoundRobin, make_policy
from loadaware.policies.lane import Lane
from loadaware.policies.lane_spread import ALL_QUEUEING, LaneSpread, all_queueing
from loadaware.policies.loadaware import benefit, loadaware_scores, relative_loads
from loadaware.policies.ttft_model import TtftPrior
from research.candidates import ResearchCandidate
from research.predictive import Predictive


def cands(*spec: tuple[str, int, float]) -> list[Candidate]:
    return [Candidate(ep, m, load) for ep, m, load in spec]


def chosen(policy, prompt_tokens, candidates) -> str:
    choice = policy.choose(prompt_tokens, candidates)
    assert choice is not None
    return candidates[choice.index].endpoint


def test_formula_values() -> None:
    # loads 2, 4, 6: mean 4 -> relative -0.5, 0, +0.5; benefits 0, 0.5, 1
    c = cands(("a", 0, 2), ("b", 500, 4), ("c", 1000, 6))
    assert loadaware_scores(1000, c, 1.0) == pytest.approx([0.5, 0.5, 0.5])
    assert loadaware_scores(1000, c, 0.5) == pytest.approx([0.25, 0.5, 0.75])
    assert loadaware_scores(1000, c, 2.0) == pytest.approx([1.0, 0.5, 0.0])


def test_scale_invariance_of_loads() -> None:
    base = cands(("a", 900, 12), ("b", 300, 3), ("c", 0, 6))
    policy = LoadAware(beta=1.0)
    for factor in (1, 10, 100):
        scaled = [Candidate(c.endpoint, c.matched_tokens, c.load * factor) for c in base]
        assert chosen(policy, 1000, scaled) == chosen(policy, 1000, base)
        assert loadaware_scores(1000, scaled, 1.0) == pytest.approx(loadaware_scores(1000, base, 1.0))


def test_prompt_length_invariance() -> None:
    policy = LoadAware(beta=0.7)
    base = cands(("a", 800, 5), ("b", 200, 2), ("c", 0, 1))
    for factor in (1, 3, 17):
        longer = [Candidate(c.endpoint, c.matched_tokens * factor, c.load) for c in base]
        assert loadaware_scores(1000 * factor, longer, 0.7) == pytest.approx(loadaware_scores(1000, base, 0.7))
        assert chosen(policy, 1000 * factor, longer) == chosen(policy, 1000, base)


def test_relative_load_is_fleet_relative_over_three_or_more() -> None:
    assert relative_loads([10, 20, 30]) == pytest.approx([-0.5, 0.0, 0.5])
    assert relative_loads([10, 20, 30, 40]) == pytest.approx([-0.6, -0.2, 0.2, 0.6])
    # the same engine load means something else in a different fleet
    assert relative_loads([20, 20, 20])[0] == 0.0
    assert relative_loads([20, 40, 60])[0] == pytest.approx(-0.5)


def test_near_idle_clamp() -> None:
    # mean 1/3 < 1: the scale is clamped to 1 so one request is worth one unit, not 3
    assert relative_loads([1, 0, 0]) == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    assert relative_loads([0, 0, 0]) == [0.0, 0.0, 0.0]
    # a warm holder with one request in flight ties a cold idle engine at beta 1 (1 - 2/3 = 0 + 1/3);
    # the tie goes to the cache hit
    assert chosen(LoadAware(1.0), 1000, cands(("a", 1000, 1), ("b", 0, 0), ("c", 0, 0))) == "a"


def test_benefit_cap_and_edges() -> None:
    assert benefit(2000, 1000) == 1.0  # a lookup can report more than we tokenized (chat templates, BOS)
    assert benefit(500, 1000) == 0.5
    assert benefit(0, 1000) == 0.0
    assert benefit(100, 0) == 0.0
    c = cands(("a", 5000, 3), ("b", 1000, 3))
    assert loadaware_scores(1000, c, 1.0) == pytest.approx([1.0, 1.0])


def test_beta_zero_is_pure_affinity() -> None:
    c = cands(("a", 600, 100), ("b", 500, 0), ("c", 0, 0))
    assert chosen(LoadAware(0.0), 1000, c) == "a"
    # with nothing matched, beta 0 ties everything: the tie-break (lowest load, then name) decides
    c = cands(("a", 0, 5), ("b", 0, 1), ("c", 0, 1))
    assert chosen(LoadAware(0.0), 1000, c) == "b"


@pytest.mark.parametrize("beta", [0.25, 0.5, 1.0, 2.0])
def test_beta_crossover_warm_saturated_vs_cold_idle(beta: float) -> None:
    """Warm holder at load L vs two cold idle engines: the holder keeps the request exactly while
    1 - beta*rel(L) >= -beta*rel(0), i.e. beta * (rel(L) - rel(0)) <= 1 (ties go to the match)."""
    for load in range(0, 40):
        c = cands(("warm", 1000, load), ("cold1", 0, 0), ("cold2", 0, 0))
        rel = relative_loads([load, 0, 0])
        expect_warm = 1 - beta * rel[0] >= -beta * rel[1] - 1e-9  # a tie goes to the match
        got = chosen(LoadAware(beta), 1000, c)
        assert (got == "warm") == expect_warm, (beta, load)
    # The crossover exists only when beta * (rel_warm - rel_cold) can exceed 1. With 3 engines and the
    # load all on the warm one, rel_warm - rel_cold = 3: below beta = 1/3 the warm engine never loses.
    far_gone = chosen(LoadAware(beta), 1000, cands(("warm", 1000, 10**6), ("cold1", 0, 0), ("cold2", 0, 0)))
    assert (far_gone == "warm") == (beta * 3 <= 1)


def test_tie_break_is_deterministic_whatever_the_order() -> None:
    specs = [("c", 0, 2), ("a", 0, 2), ("b", 0, 2), ("d", 0, 3)]
    results = {chosen(LoadAware(1.0), 100, cands(*perm)) for perm in itertools.permutations(specs)}
    assert results == {"a"}
    results = {chosen(KvAware(), 100, cands(*perm)) for perm in itertools.permutations(specs)}
    assert results == {"a"}


def test_empty_fleet() -> None:
    for name in ("loadaware", "kvaware", "roundrobin", "leastload"):
        assert make_policy(name).choose(100, []) is None


def test_missing_stats_mean_zero_credit() -> None:
    # no lookup answer and no loads: everything ties, tie-break picks the smallest name
    c = cands(("b", 0, 0), ("a", 0, 0))
    assert chosen(LoadAware(1.0), 0, c) == "a"


def test_kvaware_ignores_load_when_something_matches() -> None:
    c = cands(("a", 1000, 50), ("b", 0, 0), ("c", 256, 0))
    assert chosen(KvAware(), 1000, c) == "a"
    # nothing matched: load only
    c = cands(("a", 0, 5), ("b", 0, 2), ("c", 0, 3))
    assert chosen(KvAware(), 1000, c) == "b"


def test_leastload_and_roundrobin() -> None:
    assert chosen(LeastLoad(), 0, cands(("a", 999, 4), ("b", 0, 1), ("c", 0, 2))) == "b"
    rr = RoundRobin()
    c = cands(("c", 0, 0), ("a", 0, 0), ("b", 0, 0))
    assert [chosen(rr, 0, c) for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]


def test_make_policy_rejects_unknown() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("random")
    assert make_policy("loadaware", beta=0.5).beta == 0.5  # type: ignore[attr-defined]


# ---- predictive (research/predictive.py, a research arm) ------------------------------------------------------
def test_predictive_keeps_a_hit_when_the_holder_is_not_backed_up() -> None:
    p = Predictive()
    cands = (ResearchCandidate("a", 1536, 20.0, decode_batch=20.0), ResearchCandidate("b", 0, 18.0, decode_batch=18.0))
    choice = p.choose(1578, cands)
    assert choice is not None and choice.index == 0


def test_predictive_moves_off_a_holder_with_a_long_prefill_queue() -> None:
    p = Predictive()
    cands = (ResearchCandidate("a", 1536, 20.0, prefill_tokens=20_000, decode_batch=20.0),
             ResearchCandidate("b", 0, 18.0, decode_batch=18.0))
    choice = p.choose(1578, cands)
    assert choice is not None and choice.index == 1


def test_predictive_prices_tokens_at_each_engines_learned_speed() -> None:
    # Same signals, but a learned a four times slower prefill: the same miss costs more there.
    p = Predictive()
    slow = ResearchCandidate("a", 0, 5.0, decode_batch=5.0, ttft_base_s=0.05, ttft_per_token_s=1e-3,
                             ttft_per_running_s=0.0025)
    fast = ResearchCandidate("b", 0, 5.0, decode_batch=5.0, ttft_base_s=0.05, ttft_per_token_s=2.5e-4,
                     ttft_per_running_s=0.0025)
    choice = p.choose(1000, (slow, fast))
    assert choice is not None and choice.index == 1
    costs = [-s for s in choice.scores]
    assert costs[0] > 3 * costs[1] * 0.9  # the per-token terms dominate and scale with the learned speed


def test_predictive_keeps_a_long_prefix_on_a_busy_holder() -> None:
    # A 3,000-token prefix: its holder has a bigger batch and a little queued work, the idle peer would have to
    # prefill it all (~0.75 s at the prior's rate) and stall its own batch meanwhile: the request stays.
    p = Predictive()
    cands = (ResearchCandidate("a", 3000, 30.0, prefill_tokens=600, decode_batch=28.0),
             ResearchCandidate("b", 0, 8.0, decode_batch=8.0))
    choice = p.choose(3040, cands)
    assert choice is not None and choice.index == 0


def test_predictive_spreads_a_miss_to_the_smaller_batch() -> None:
    # Nobody holds the prompt and no lane is backed up: the batch that one more sequence slows least wins.
    p = Predictive()
    cands = (ResearchCandidate("a", 0, 40.0, decode_batch=40.0), ResearchCandidate("b", 0, 10.0, decode_batch=10.0))
    choice = p.choose(1578, cands)
    assert choice is not None and choice.index == 1


def test_predictive_prices_held_tokens_that_must_be_loaded() -> None:
    # Both engines "hold" the prefix, but a learned price says a's held tokens are loaded, not free: the work
    # queued on a (many held prompts waiting for their first token) makes b, with none, the cheaper holder.
    p = Predictive()
    learned: dict[str, Any] = {"ttft_base_s": 0.05, "ttft_per_token_s": 2.5e-4, "ttft_per_running_s": 0.0025}
    loaded = ResearchCandidate("a", 1536, 10.0, decode_batch=8.0, prefill_matched_tokens=12_000,
                       ttft_per_matched_token_s=1e-4, **learned)
    free = ResearchCandidate("b", 1536, 10.0, decode_batch=8.0, prefill_matched_tokens=0, ttft_per_matched_token_s=1e-4,
                     **learned)
    choice = p.choose(1578, (loaded, free))
    assert choice is not None and choice.index == 1
    # With held tokens priced at zero the two are the same engine, and the tie-break keeps the first.
    zero = [ResearchCandidate(c.endpoint, c.matched_tokens, c.load, decode_batch=c.decode_batch,
                      prefill_matched_tokens=c.prefill_matched_tokens, ttft_per_matched_token_s=0.0, **learned)
            for c in (loaded, free)]
    again = p.choose(1578, zero)
    assert again is not None and again.scores[0] == pytest.approx(again.scores[1])


def test_predictive_caps_the_learned_held_price() -> None:
    # A held token never costs more than h x a computed one, whatever the fit says (under load the admission
    # wait correlates with held tokens queued): a learned price ten times a computed token's is cut to h.
    p = Predictive()
    learned: dict[str, Any] = {"ttft_base_s": 0.0, "ttft_per_token_s": 1e-4, "ttft_per_running_s": 0.0}
    c = ResearchCandidate("a", 1000, 0.0, ttft_per_matched_token_s=1e-3, **learned)
    (cost,) = p.costs(1000, (c,))
    assert cost == pytest.approx(p.held_cap * 1e-4 * 1000)


def test_predictive_saturated_fleet_minimises_prefill_work() -> None:
    # Every engine has an admission queue: a miss cannot dodge the slot wait, so the holder keeps the request
    # even with the larger load (outside saturation its load would count).
    p = Predictive()
    holder = Candidate("a", 1536, 120.0, prefill_tokens=400, decode_batch=64.0, waiting=56.0)
    other = Candidate("b", 0, 70.0, prefill_tokens=400, decode_batch=60.0, waiting=6.0)
    choice = p.choose(1578, (holder, other))
    assert choice is not None and choice.index == 0
    costs = [-s for s in choice.scores]
    assert costs[1] / costs[0] == pytest.approx((400 + 1578) * 61 / ((400 + 42) * 65))


def test_predictive_empty_fleet() -> None:
    assert Predictive().choose(10, ()) is None


def test_lane_prices_the_clock_ahead_the_own_prefill_and_the_steps_then_weighs_the_batch() -> None:
    p = Lane()
    learned = Candidate("a", 1000, 9.0, decode_batch=8.0, lane_wait_s=0.2, idle_ttft_base_s=0.03,
                        idle_ttft_per_token_s=4e-4, idle_ttft_per_running_s=0.002)
    prior = Candidate("b", 0, 3.0, decode_batch=3.0)  # nothing learned: the prior's prices, an idle clock
    pr = TtftPrior()
    want_a = (0.2 + 4e-4 * 600 + 0.03 + 0.002 * 9) * 9 ** 0.75  # x (8 + 1)^0.75
    want_b = (pr.per_token_s * 1600 + pr.base_s + pr.per_running_s * 3) * 4 ** 0.75  # x (3 + 1)^0.75
    assert p.costs(1600, [learned, prior]) == pytest.approx([want_a, want_b])
    choice = p.choose(1600, [learned, prior])
    assert choice is not None and choice.scores == pytest.approx((-want_a, -want_b))
    assert p.choose(1600, []) is None


def test_lane_leaves_a_holder_whose_clock_is_far_behind() -> None:
    p = Lane()
    holder = Candidate("a", 1536, 10.0, decode_batch=10.0)
    other = Candidate("b", 0, 10.0, decode_batch=10.0)
    assert chosen(p, 1578, [holder, other]) == "a"  # a hit saves ~0.4 s of prefill
    holder.lane_wait_s = 1.0  # a second of prefill work queued ahead of it
    assert chosen(p, 1578, [holder, other]) == "b"


def test_lane_keeps_a_hit_off_a_batch_many_times_larger() -> None:
    p = Lane()
    full = Candidate("a", 1536, 60.0, decode_batch=60.0)
    idle = Candidate("b", 0, 2.0, decode_batch=2.0)
    assert chosen(p, 1578, [full, idle]) == "b"  # the greedy choice (the hit) would fill the holder to its cap
    assert Lane().ttft(1578, full) < Lane().ttft(1578, idle)


def test_lane_keeps_a_saturated_fleet_s_prefixes_where_they_are_cached() -> None:
    p = Lane()
    holder = Candidate("a", 1536, 70.0, decode_batch=64.0, lane_wait_s=0.45)
    other = Candidate("b", 0, 66.0, decode_batch=64.0)
    # With free slots everywhere (no admission queue scraped) the holder's backed-up clock sends the miss away.
    assert chosen(p, 1578, [holder, other]) == "b"
    # Both engines queue for admission: the miss's own 0.4 s of prefill would delay the ~9 requests queued on b.
    holder.waiting, other.waiting = 10.0, 9.0
    assert chosen(p, 1578, [holder, other]) == "a"
    own_b = TtftPrior().per_token_s * 1578
    assert Lane().costs(1578, [holder, other])[1] == pytest.approx(Lane().ttft(1578, other) * 65 ** 0.75 + own_b * 9.0)


def test_lane_spread_chooses_as_loadaware_while_every_endpoint_queues() -> None:
    p = LaneSpread()
    # Both engines queue for admission; a's decode batch is at the engine's cap and its queue is long, b's short.
    holder = Candidate("a", 1536, 120.0, decode_batch=64.0, waiting=56.0)
    other = Candidate("b", 0, 40.0, decode_batch=40.0, waiting=1.0)
    costs = p.costs(1578, [holder, other])
    assert costs[0] < costs[1]  # lane's price sends the hit to its holder, whatever the queue ahead of it
    choice = p.choose(1578, [holder, other])
    balanced = LoadAware().choose(1578, [holder, other])
    assert choice is not None and balanced is not None
    assert (choice.index, choice.scores, choice.rule) == (1, balanced.scores, ALL_QUEUEING)
    # An engine with no admission queue: lane-spread's own rule again (scores are its negated costs).
    other.waiting = 0.0
    choice = p.choose(1578, [holder, other])
    assert choice is not None and choice.rule == ""
    assert choice.scores == pytest.approx(tuple(-x for x in p.costs(1578, [holder, other])))
    assert not all_queueing([]) and all_queueing([holder])


def test_while_every_endpoint_queues_a_holder_stays_within_one_mean_load_of_the_least_loaded() -> None:
    """lane-spread's guard is off then (loadaware chooses): loadaware's own bound holds instead. A full match is
    worth one mean load, so the holder of a hot prefix takes requests only while it carries less than one
    mean load more than the least loaded: in a pool of three, at most 5/9 of the requests in flight."""
    p = LaneSpread()
    loads = {"a": 10.0, "b": 10.0, "c": 10.0}
    for _ in range(200):  # every request holds a's prefix; each one routed stays in flight
        candidates = [Candidate(ep, 1536 if ep == "a" else 0, load, decode_batch=64.0, waiting=5.0)
                      for ep, load in loads.items()]
        choice = p.choose(1536, candidates)
        assert choice is not None and choice.rule == ALL_QUEUEING
        loads[candidates[choice.index].endpoint] += 1
        mean = sum(loads.values()) / 3
        assert loads["a"] - min(loads["b"], loads["c"]) <= mean + 1
    total = sum(loads.values())
    assert 0.5 * total < loads["a"] <= 5 / 9 * total + 1  # past half, never past 5/9 (and the request at the edge)
