"""The reference workload: deterministic per seed, exact measured token counts, stated distributions."""

from __future__ import annotations

import numpy as np
import pytest

from experiment.workload import (
    WorkloadSpec,
    arrival_times,
    build,
    describe,
    encode_request,
    measured_arrivals,
    prefix_sequence,
    zipf_probabilities,
)

SMALL = WorkloadSpec(n_prefixes=16, n_requests=60)


def test_same_seed_same_workload_other_seed_differs() -> None:
    a, b, c = build(SMALL, 3), build(SMALL, 3), build(SMALL, 4)
    assert [r.token_ids for r in a.requests] == [r.token_ids for r in b.requests]
    assert [r.send_at for r in a.requests] == [r.send_at for r in b.requests]
    assert [r.prefix for r in a.warmup] == [r.prefix for r in b.warmup]
    assert [r.send_at for r in a.requests] != [r.send_at for r in c.requests]
    assert [r.prefix for r in a.requests] != [r.prefix for r in c.requests]
    # The documents themselves do not depend on the seed (only on corpus_seed).
    assert a.prefix_ids == c.prefix_ids


def test_reference_token_counts_are_measured_with_the_project_tokenizer() -> None:
    w = build(WorkloadSpec(n_requests=40), 1)
    d = describe(w)
    assert d["prompt_tokens_mean"] == 1578 and d["shared_tokens_mean"] == 1544
    assert d["shared_fraction"] == pytest.approx(0.978, abs=0.001)  # the reference's "~97.8% cacheable"
    assert d["block16_ceiling"] == pytest.approx(1536 / 1578)
    for r in w.requests[:15] + w.warmup[:5]:
        assert encode_request(r) == list(r.token_ids)  # what the engine will tokenize from the HTTP body
        assert r.token_ids[:1544] == w.prefix_ids[r.prefix]
    suffixes = {r.token_ids[1544:] for r in w.requests + w.warmup}
    assert len(suffixes) == len(w.requests) + len(w.warmup)  # every suffix unique
    assert len({p[:16] for p in w.prefix_ids}) == 128  # prefixes differ from their first block on


def test_chat_prompts_render_to_the_same_lengths() -> None:
    w = build(WorkloadSpec(n_prefixes=8, n_requests=10, api="chat"), 1)
    for r in w.requests[:5]:
        assert r.body()["messages"][0]["content"] == r.prefix_text
        assert encode_request(r) == list(r.token_ids)
        assert r.prompt_tokens == 1578 and r.token_ids[:1544] == w.prefix_ids[r.prefix]


def test_alignment_option_rounds_the_shared_prefix_down() -> None:
    spec = WorkloadSpec(n_prefixes=4, n_requests=5, align_prefix_to=256)
    assert spec.shared_tokens == 1536
    w = build(spec, 1)
    assert {len(p) for p in w.prefix_ids} == {1536} and w.requests[0].prompt_tokens == 1570


def test_body_is_streaming_ignore_eos_with_max_tokens() -> None:
    r = build(SMALL, 1).requests[0]
    body = r.body()
    assert body["stream"] is True and body["ignore_eos"] is True and body["max_tokens"] == 64
    assert body["prompt"] == r.prefix_text + r.suffix_text and r.path == "/v1/completions"


def test_warmup_is_two_full_passes_over_every_prefix() -> None:
    w = build(SMALL, 5)
    order = [r.prefix for r in w.warmup]
    assert sorted(order[:16]) == list(range(16)) and sorted(order[16:]) == list(range(16))
    assert order[:16] != order[16:]  # each pass shuffled on its own


def test_zipf_rank1_probability_and_empirical_distribution() -> None:
    spec = WorkloadSpec()
    p = zipf_probabilities(128, 0.9)
    # the reference workload's published rank-1 probability: 1 / sum(k^-0.9 for k in 1..128) = 0.147
    assert p[0] == pytest.approx(0.147, abs=0.0005)
    ranks = prefix_sequence(spec, 1, n=40_000)
    counts = np.bincount(ranks, minlength=128)
    assert counts[0] / 40_000 == pytest.approx(p[0], abs=0.006)
    chisq = ((counts - 40_000 * p) ** 2 / (40_000 * p)).sum()
    assert chisq < 200  # 127 degrees of freedom: the 99.9th percentile is ~181, a wrong s gives thousands


def test_poisson_arrivals_have_the_offered_rate_and_exponential_gaps() -> None:
    t = measured_arrivals(WorkloadSpec(rate=16.0), 2, n=20_000)
    assert t[0] == 0 and np.all(np.diff(t) >= 0)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(1 / 16, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential: CV 1


@pytest.mark.parametrize("arrival", ["gamma", "mmpp"])
def test_bursty_arrivals_keep_the_mean_rate_and_are_burstier(arrival: str) -> None:
    spec = WorkloadSpec(rate=16.0, arrival=arrival)  # type: ignore[arg-type]
    t = arrival_times(spec, 40_000, np.random.default_rng(9))
    gaps = np.diff(t)
    assert 1 / gaps.mean() == pytest.approx(16.0, rel=0.08)
    assert gaps.std() / gaps.mean() > 1.3
    if arrival == "gamma":
        assert gaps.std() / gaps.mean() == pytest.approx(spec.burst_cv, rel=0.1)


def test_invalid_specs_are_refused() -> None:
    with pytest.raises(ValueError):
        WorkloadSpec(rate=0)
    with pytest.raises(ValueError):
        WorkloadSpec(arrival="mmpp", mmpp_high_factor=6, mmpp_high_share=0.2)


def test_multi_turn_conversations_grow_and_their_earlier_turns_warm_up() -> None:
    from dataclasses import replace as _replace

    spec = _replace(WorkloadSpec(n_prefixes=4, n_requests=60, rate=20.0, max_tokens=8, suffix_tokens=20),
                    turns=3, turn_gap_s=1.0, think_s=0.5)
    w = build(spec, 1)
    reqs = w.requests
    assert len(reqs) == 60
    assert [r.send_at for r in reqs] == sorted(r.send_at for r in reqs) and reqs[0].send_at == 0.0
    by_history = sorted(list(reqs) + [r for r in w.warmup if r.wave == spec.warmup_passes],
                        key=lambda r: len(r.token_ids))
    grown = 0
    for r in reqs:
        shared = w.prefix_ids[r.prefix]
        assert r.token_ids[: len(shared)] == shared  # every turn starts with its system prompt
        # a later turn resends an earlier turn's whole prompt (and its reply) as its own prefix
        if any(len(o.token_ids) < len(r.token_ids) and r.token_ids[: len(o.token_ids)] == o.token_ids
               for o in by_history if o is not r):
            grown += 1
    assert grown > len(reqs) // 3
    assert any(r.wave == spec.warmup_passes for r in w.warmup)  # conversations in progress warmed up
    assert build(spec, 1).requests == reqs  # deterministic
