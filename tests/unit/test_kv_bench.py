"""The KV-events benchmark's own machinery, on a quick run: the relations its figures must satisfy whatever
the machine (counts of what was sent and indexed, matches, per-operation normalisation), never its timing
targets, which a busy machine may miss without anything being wrong."""

from __future__ import annotations

import math

import pytest

from bench import kv_events
from loadaware.prefix.kvevents.query import KvEventsPrefixSource

BS = kv_events.BS
QUICK_DECISIONS, QUICK_BATCHES = 300, 500  # what run(quick=True) measures
ENGINES, PREFIXES, HOLDERS = 64, 128, 4  # build_fleet_index's fleet
LIVE_RUNS = 65  # the churn keeps the last 65 runs: one stored per batch, the oldest removed beyond 64


@pytest.fixture(scope="module")
def result() -> dict:
    return kv_events.run(quick=True)


def test_decision_figures_describe_the_fleet_and_credit_every_holder(result: dict) -> None:
    decision = result["decision"]
    prompt_tokens = kv_events.PREFIX_TOKENS + kv_events.SUFFIX_TOKENS
    assert decision["prompt_tokens"] == prompt_tokens == 1578
    assert (decision["engines"], decision["prefixes"], decision["iterations"]) == (ENGINES, PREFIXES, QUICK_DECISIONS)
    # every holder of every prefix stored its whole prompt's full blocks, once
    assert decision["indexed_blocks"] == PREFIXES * HOLDERS * (prompt_tokens // BS)
    assert decision["holders_credited_per_prompt"] == HOLDERS  # every one of the 4 holders of each prefix


def test_matched_tokens_are_the_shared_prefix_s_full_blocks() -> None:
    # The decision's prompts share only their prefix with what the holders cached (each holder cached its
    # own random suffix): each holder matches exactly the prefix's full blocks, nobody else matches.
    index, names, texts = kv_events.build_fleet_index()
    source = KvEventsPrefixSource(index)
    prompt = texts[0] + [7] * kv_events.SUFFIX_TOKENS
    matches = source.lookup(prompt, tuple(names))
    assert len(matches) == HOLDERS
    assert set(matches.values()) == {kv_events.PREFIX_TOKENS // BS * BS}


def test_decision_costs_are_per_operation_and_nested(result: dict) -> None:
    decision = result["decision"]
    keys, lookup, whole = decision["block_keys_us"], decision["lookup_us"], decision["decision_cpu_us"]
    assert all(math.isfinite(x) and x > 0 for x in (keys, lookup, whole))
    # Each stage contains the previous one (a decision = keys + index walk + policy). Generous factors: the
    # stages are timed in separate loops, but a missing per-iteration division would be off by 300x.
    assert keys <= 2 * lookup and lookup <= 2 * whole
    # Per operation: a tenth of the iterations costs about the same per decision, not a tenth of it.
    fewer = kv_events.bench_decision(QUICK_DECISIONS // 10)
    assert fewer["iterations"] == QUICK_DECISIONS // 10
    assert 1 / 5 <= fewer["decision_cpu_us"] / whole <= 5


def test_ingest_indexes_exactly_what_was_sent(result: dict) -> None:
    ingest = result["ingest"]
    stored = QUICK_BATCHES * 16  # one 16-block run stored per batch
    removed = (QUICK_BATCHES - LIVE_RUNS) * 16  # every batch beyond the 65th removes the oldest run
    assert ingest["batches"] == QUICK_BATCHES
    assert ingest["block_events"] == stored + removed
    assert ingest["indexed_blocks_after"] == stored - removed == LIVE_RUNS * 16
    # the rates are one measurement seen three ways
    assert math.isfinite(ingest["cpu_s"]) and ingest["cpu_s"] > 0
    assert ingest["block_events_per_s"] == pytest.approx(ingest["block_events"] / ingest["cpu_s"])
    assert ingest["us_per_block_event"] == pytest.approx(1e6 / ingest["block_events_per_s"])
    assert math.isfinite(ingest["decode_share"]) and ingest["decode_share"] > 0


def test_verdicts_follow_the_figures_and_the_table_shows_them(result: dict) -> None:
    decision, ingest, targets = result["decision"], result["ingest"], result["targets"]
    assert result["meets"] == {"decision": decision["decision_cpu_us"] <= targets["decision_cpu_us"],
                               "ingest": ingest["block_events_per_s"] >= targets["ingest_block_events_per_s"]}
    table = kv_events.table(result)
    assert "KV-events decision path" in table
    assert f"{decision['decision_cpu_us']:,.0f} µs" in table and f"{ingest['block_events_per_s']:,.0f}" in table
