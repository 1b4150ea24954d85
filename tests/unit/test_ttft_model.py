"""The online per-endpoint TTFT model: it recovers a linear law from noisy observations, forgets, and holds
to its prior before it has seen anything."""

from __future__ import annotations

import random

import pytest

from loadaware.policies.ttft_model import REFIT_EVERY, TtftModel, TtftPrior


def test_prior_before_any_observation() -> None:
    prior = TtftPrior()
    m = TtftModel(prior)
    assert m.observations == 0
    assert m.base_s == pytest.approx(prior.base_s)
    assert m.per_token_s == pytest.approx(prior.per_token_s)
    assert m.per_running_s == pytest.approx(prior.per_running_s)


def test_recovers_a_linear_law() -> None:
    rng = random.Random(1)
    m = TtftModel()
    for _ in range(400):
        tokens, running = rng.uniform(0, 4000), rng.uniform(0, 40)
        m.observe(tokens, running, 0.03 + tokens / 2000 + 0.004 * running + rng.gauss(0, 0.005))
    assert m.per_token_s == pytest.approx(1 / 2000, rel=0.05)
    assert m.per_running_s == pytest.approx(0.004, rel=0.15)
    assert m.predict(1000, 10) == pytest.approx(0.03 + 0.5 + 0.04, rel=0.05)
    # prices(): the four coefficients from one fit, as a candidate copies them (the hot path reads it once).
    assert m.prices() == (m.base_s, m.per_token_s, m.per_matched_token_s, m.per_running_s)
    assert m.prices()[1] == pytest.approx(1 / 2000, rel=0.05)


def test_forgets_an_old_speed() -> None:
    rng = random.Random(2)
    m = TtftModel()
    for slope in (1 / 4000, 1 / 1000):  # the engine slows down four-fold
        for _ in range(300):
            tokens = rng.uniform(0, 3000)
            m.observe(tokens, 10, 0.02 + tokens * slope)
    assert m.per_token_s == pytest.approx(1 / 1000, rel=0.05)


def test_ignores_nonsense() -> None:
    m = TtftModel()
    m.observe(float("nan"), 1, 0.1)
    m.observe(100, 1, -1.0)
    assert m.observations == 0


def test_learns_what_a_held_token_costs() -> None:
    # Held tokens that must be loaded from a slower tier cost a third of a computed one: the fit prices them so,
    # and an engine whose held tokens are free keeps that price at zero.
    rng = random.Random(3)
    loaded, free = TtftModel(), TtftModel()
    for _ in range(400):
        tokens, matched, running = rng.uniform(0, 3000), rng.uniform(0, 6000), rng.uniform(0, 30)
        base = 0.02 + tokens / 4000 + 0.002 * running
        loaded.observe(tokens, running, base + matched / 12000, matched)
        free.observe(tokens, running, base, matched)
    assert loaded.per_matched_token_s == pytest.approx(1 / 12000, rel=0.05)
    assert loaded.per_token_s == pytest.approx(1 / 4000, rel=0.05)
    assert free.per_matched_token_s == pytest.approx(0.0, abs=1e-6)
    assert loaded.predict(1000, 10, 3000) == pytest.approx(0.02 + 0.25 + 0.02 + 0.25, rel=0.05)


def test_refits_on_every_early_observation_then_every_refit_every() -> None:
    """Read on every decision, the fit follows each of the first REFIT_EVERY lessons, then moves once per
    REFIT_EVERY more: between refits the prices stand, and the refit lands on the fit of everything seen."""
    m = TtftModel()
    seen = []
    for k in range(REFIT_EVERY):
        m.observe(100 * (k + 1), 1, 0.2 + 0.001 * 100 * (k + 1))
        seen.append(m.prices())
    assert len(set(seen)) == REFIT_EVERY  # each early lesson moved the prices
    held = m.prices()
    for _ in range(REFIT_EVERY - 1):
        m.observe(3000, 2, 5.0)  # a much slower engine: not shown until the refit
        assert m.prices() == held
    m.observe(3000, 2, 5.0)
    moved = m.prices()
    fresh = TtftModel()
    fresh._xx, fresh._xy, fresh.observations = m._xx, m._xy, m.observations
    assert moved != held and moved == fresh.prices()
