"""Service-time model arithmetic and its CLI flags."""

import argparse

import pytest

from sim.service_model import ServiceModel, add_cli_flags, from_cli_args, split_prompt


def test_default_numbers_are_fast_enough_for_tests() -> None:
    m = ServiceModel()
    assert m.prefill_seconds(1600) == pytest.approx(0.020)
    assert m.decode_step_seconds(4) == pytest.approx(0.005)
    assert m.decode_step_seconds(0) == m.decode_step_seconds(1)
    assert m.kv_capacity_blocks == m.kv_capacity_tokens // 16


def test_prefill_charges_only_uncached_tokens_plus_loads() -> None:
    m = ServiceModel(prefill_tokens_per_s=1000, prefill_overhead_ms=10, lmcache_load_tokens_per_s=10_000)
    assert m.prefill_seconds(0) == pytest.approx(0.010)
    assert m.prefill_seconds(500, loaded_tokens=1000) == pytest.approx(0.010 + 0.5 + 0.1)


def test_split_prompt_recomputes_the_last_token_and_loads_only_beyond_gpu_hit() -> None:
    assert split_prompt(1600, 0, 0) == (1600, 0)
    assert split_prompt(1600, 1600, 0) == (1, 0)  # full hit still computes one token
    assert split_prompt(1600, 512, 1536) == (64, 1024)
    assert split_prompt(1600, 1536, 512) == (64, 0)


def test_decode_step_grows_with_batch() -> None:
    m = ServiceModel(decode_base_ms=10, decode_per_seq_ms=2)
    assert m.decode_step_seconds(5) == pytest.approx(0.020)


def test_cli_flags_override_defaults() -> None:
    p = argparse.ArgumentParser()
    add_cli_flags(p)
    m = from_cli_args(p.parse_args(["--max-num-seqs", "3", "--prefill-tokens-per-s", "2500"]))
    assert m.max_num_seqs == 3 and m.prefill_tokens_per_s == 2500.0 and m.decode_base_ms == 4.0


def test_invalid_parameters_rejected() -> None:
    with pytest.raises(ValueError):
        ServiceModel(max_num_seqs=0)


def test_prefill_lane_queues_overlapping_prefills() -> None:
    from sim.service_model import PrefillLane

    lane = PrefillLane()
    assert lane.reserve(now=1.0, duration=0.5) == 1.5
    assert lane.reserve(now=1.1, duration=0.5) == 2.0  # waits for the first
    assert lane.reserve(now=5.0, duration=0.1) == 5.1  # idle lane: starts at once
