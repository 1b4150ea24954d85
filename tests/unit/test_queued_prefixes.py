"""The queued-prefix index (loadaware/prefix/queued.py): what requests routed to a queueing engine hold, the
credit it gives later requests there, and its place in the pipeline and the simulator."""

from __future__ import annotations

import asyncio
import time

import pytest

from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.load.signals import SignalTracker
from loadaware.load.tracker import EngineStats, LoadTracker
from loadaware.policies import Candidate, make_policy
from loadaware.policies.lane import Lane
from loadaware.prefix.blocks import block_keys as chain
from loadaware.prefix.blocks import chain_keys
from loadaware.prefix.queued import (
    STRIDE,
    QueuedIndex,
    QueuedPrefixes,
    Receipt,
    credit,
    sampled,
)
from loadaware.prefix.source import PromptTokens
from loadaware.routing.builder import build_decider
from loadaware.routing.pipeline import Decider
from loadaware.routing.request import InferenceRequest
from tests.unit.test_load_signals import Matches

A, B = "127.0.0.2:8000", "127.0.0.3:8000"
PROMPT = list(range(1000, 1000 + 20 * 16 + 5))  # 20 full blocks and a partial one: 5 held keys of 4 blocks
UNIT = STRIDE * 16  # prompt tokens per held key


def block_keys(tokens: list[int], salt: str | None = None) -> list[int]:
    """What the index holds of a prompt: every STRIDE-th key of its chain."""
    return list(sampled(chain(tokens, salt=salt)))


def _other(shared_blocks: int) -> list[int]:
    """A prompt sharing PROMPT's first `shared_blocks` blocks, then different."""
    return PROMPT[:shared_blocks * 16] + [7] * (8 * 16)


def test_hold_match_release_refcounts_per_engine() -> None:
    index = QueuedIndex()
    keys = block_keys(PROMPT)
    first = index.hold(A, keys)
    second = index.hold(A, keys)
    assert first is not None and second is not None
    assert index.total_blocks == 5 and index.blocks() == {A: 5}
    assert index.match(block_keys(_other(12)), [A, B]) == {A: 12 * 16}  # stops at the first unshared block
    assert index.match(block_keys(_other(10)), [A]) == {A: 2 * UNIT}  # short of it by less than a key
    assert index.match(keys, [B]) == {}  # only the asked endpoints
    index.release(first)
    assert index.match(keys, [A, B]) == {A: 20 * 16}  # the other request still holds them
    index.release(second)
    assert not index and index.match(keys, [A, B]) == {} and index.blocks() == {}


def test_a_salted_prompt_walks_only_its_own_chain() -> None:
    index = QueuedIndex()
    index.hold(A, block_keys(PROMPT, salt="tenant-1"))
    assert index.match(block_keys(PROMPT), [A]) == {}
    assert index.match(block_keys(PROMPT, salt="tenant-2"), [A]) == {}
    assert index.match(block_keys(PROMPT, salt="tenant-1"), [A]) == {A: 20 * 16}


def test_the_bound_refuses_holds_and_never_credits_past_it() -> None:
    index = QueuedIndex(max_blocks=7)
    assert index.hold(A, block_keys(PROMPT)) is not None
    assert index.hold(A, block_keys(PROMPT)) is not None  # no new entries: allowed
    assert index.hold(B, block_keys(PROMPT)) is None  # 5 more would pass 7
    assert index.skipped == 1 and index.total_blocks == 5 and index.match(block_keys(PROMPT), [B]) == {}


def test_a_departed_endpoint_is_forgotten_and_its_old_receipts_do_nothing() -> None:
    index = QueuedIndex()
    old = index.hold(A, block_keys(PROMPT))
    assert old is not None
    index.drop(A)
    assert not index and index.match(block_keys(PROMPT), [A]) == {}
    again = index.hold(A, block_keys(_other(5)))  # the same name back, holding something else
    assert again is not None
    index.release(old)  # a request from before the departure ends: it must not touch the new holds
    assert index.match(block_keys(_other(5)), [A]) == {A: 3 * UNIT}  # 13 blocks: 3 whole keys
    index.release(again)
    assert index.total_blocks == 0


def test_credit_raises_only_queueing_candidates_and_never_lowers_a_match() -> None:
    index = QueuedIndex()
    index.hold(A, block_keys(PROMPT))
    index.hold(B, block_keys(PROMPT))
    n = len(PROMPT)
    queueing = Candidate(A, 64, 3.0, waiting=2.0)
    free = Candidate(B, 0, 1.0, waiting=0.0)  # admitted at once, it would prefill beside the held request
    assert credit([queueing, free], index, block_keys(PROMPT), n) == 20 * 16 - 64
    assert (queueing.matched_tokens, queueing.queued_tokens) == (20 * 16, 20 * 16 - 64)
    assert (free.matched_tokens, free.queued_tokens) == (0, 0)
    exact = Candidate(A, n, 3.0, waiting=2.0)  # the exact source already shows more
    assert credit([exact], index, block_keys(PROMPT), n) == 0 and exact.matched_tokens == n


def _decision(endpoint: str, tokens: list[int], waiting: float) -> Decision:
    c = Candidate(endpoint, 0, 1.0, waiting=waiting)
    return Decision("r", endpoint, "routed", (), len(tokens), (c,), (0.0,), {}, 0.0, tokens=tokens)


def test_the_lifecycle_holds_while_the_chosen_engine_queues_and_releases_at_the_end() -> None:
    queued = QueuedPrefixes()
    free = _decision(A, PROMPT, 0.0)
    queued.on_decided(free)
    assert free.queued is None and not queued.index  # not queueing: prefilled beside any later request
    waits = _decision(A, PROMPT, 4.0)
    queued.on_decided(waits)
    assert waits.queued is not None and queued.index.blocks() == {A: 5}
    queued.on_ended(waits)
    assert waits.queued is None and not queued.index
    retried = _decision(A, PROMPT, 4.0)
    queued.on_decided(retried)
    retried.served = B  # a retry walked to B: A never queued it
    queued.on_served(retried, A)
    assert not queued.index
    queued.on_ended(retried)  # nothing left to give back
    assert queued.index.total_blocks == 0


def test_keys_are_shared_between_the_credit_and_the_hold_and_honour_the_salt() -> None:
    queued = QueuedPrefixes()
    tokens = PromptTokens(PROMPT, "t")
    whole = chain_keys(tokens, 16, "t")  # e.g. the KV-events lookup of the same decision
    queued.keys(tokens)
    assert chain_keys(tokens, 16, "t") is whole  # the chain was not computed again: it lives on the token list
    assert queued.keys(tokens) == block_keys(PROMPT, salt="t") and len(queued.keys(tokens)) == 5
    assert chain_keys(tokens, 16, None) is not whole  # another salt, another chain
    plain = list(PROMPT)  # not a decision's token list: walked afresh each time, remembered nowhere
    assert chain_keys(plain, 16) == chain_keys(plain, 16) and chain_keys(plain, 16) is not chain_keys(plain, 16)


# ---- in the pipeline ----
def _decider(loads: LoadTracker) -> Decider:
    lifecycle = RequestLifecycle()
    lifecycle.subscribe(loads)
    return build_decider(make_policy("lane-spread"), EndpointRegistry((A, B)), loads, lifecycle,
                   prefix_source=Matches({}), signals=SignalTracker())


def test_the_pipeline_credits_a_queueing_engine_with_what_it_holds_and_explain_changes_nothing() -> None:
    loads = LoadTracker(stale_s=60)
    decider = _decider(loads)
    assert decider.queued is not None
    now = time.monotonic()
    loads.record(A, EngineStats(64, 5, None, now))  # A queues, B does not
    loads.record(B, EngineStats(64, 0, None, now))
    request = InferenceRequest("completions", prompt=PROMPT, model="m")
    # Route the first request to A whatever the policy prefers: the proxy's subset hint.
    first = asyncio.run(decider.decide(request, "r1", subset=frozenset({A})))
    assert first.endpoint == A and first.queued is not None
    preview = asyncio.run(decider.decide(request, "x", count=False))
    by = {c.endpoint: c for c in preview.candidates}
    assert (by[A].matched_tokens, by[A].queued_tokens) == (20 * 16, 20 * 16) and by[B].matched_tokens == 0
    assert decider.queued.credited_tokens == 0 and decider.queued.index.blocks() == {A: 5}  # a preview
    second = asyncio.run(decider.decide(request, "r2"))
    assert second.endpoint == A  # the prefix follows the queued request instead of being computed on B
    assert decider.queued.credited_tokens == 20 * 16 and decider.queued.index.blocks() == {A: 5}
    decider.lifecycle.ended(first)
    decider.lifecycle.ended(second)
    assert decider.queued.index.total_blocks == 0


def test_a_failing_credit_keeps_the_exact_matches_and_says_so() -> None:
    loads = LoadTracker(stale_s=60)
    decider = _decider(loads)
    loads.record(A, EngineStats(64, 5, None, time.monotonic()))
    queued = decider.queued
    assert queued is not None
    queued.index.hold(A, block_keys(PROMPT))

    def broken(tokens: object) -> list[int]:
        raise RuntimeError("boom")

    queued.keys = broken  # type: ignore[method-assign]
    d = asyncio.run(decider.decide(InferenceRequest("completions", prompt=PROMPT, model="m"), "r", count=False))
    assert d.endpoint is not None and "queued_prefix_error" in d.reasons
    assert {c.matched_tokens for c in d.candidates} == {0}


def test_policies_without_the_signal_carry_no_index() -> None:
    for policy in (make_policy("loadaware"), Lane(), make_policy("kvaware")):
        assert build_decider(policy, EndpointRegistry((A,)), LoadTracker(stale_s=5), RequestLifecycle()).queued is None


# ---- in the simulator ----
def test_the_simulator_holds_and_releases_as_the_sidecar_does() -> None:
    from experiment.calibration import CALIBRATED
    from experiment.des import FleetConfig, Simulation, arm_by_name, prepare
    from experiment.workload import WorkloadSpec, build

    spec = WorkloadSpec(rate=40.0, n_requests=300, n_prefixes=32, warmup_passes=1)
    # The sidecar learns an engine queues from its scrapes: every second, as its default scrape interval.
    fleet = FleetConfig(engines=2, service=CALIBRATED, router_scrape_interval_s=1.0)
    sim = Simulation(prepare(build(spec, 3)), arm_by_name("lane-spread"), fleet)
    queued = sim.router.decider.queued
    assert queued is not None
    held: list[int] = []
    release = queued.index.release

    def counting(receipt: Receipt) -> None:
        held.append(len(receipt.keys))
        release(receipt)

    queued.index.release = counting  # type: ignore[method-assign]
    sim.run()
    assert held, "40 req/s on 2 engines queues: some requests were held"
    assert queued.index.total_blocks == 0  # every hold was given back when its request ended


@pytest.mark.parametrize("name", ["lane", "loadaware"])
def test_the_simulator_keeps_no_index_for_other_policies(name: str) -> None:
    from experiment.calibration import CALIBRATED
    from experiment.des import FleetConfig, Simulation, arm_by_name, prepare
    from experiment.workload import WorkloadSpec, build

    sim = Simulation(prepare(build(WorkloadSpec(n_requests=10, n_prefixes=4), 1)), arm_by_name(name),
                     FleetConfig(engines=2, service=CALIBRATED))
    assert sim.router.decider.queued is None


def test_the_cost_bench_exercises_the_credit() -> None:
    """research.probes.queued_cost measures a sidecar whose decisions really credit, hold and release queued prompts."""
    from research.probes.queued_cost import HELD_PER_ENDPOINT, run, table

    result = run(quick=True)
    state = result["queued"]
    # the background holds stay; each measured request held its prompt and gave it back
    held = result["direct_us"]["blocks"] // STRIDE
    assert result["direct_us"]["held_keys"] == held and state["total_blocks"] == 3 * held
    assert set(state["blocks"].values()) == {held}
    assert state["credited_tokens"] > 0 and HELD_PER_ENDPOINT > 0
    assert "queued-prefix credit" in table(result)
