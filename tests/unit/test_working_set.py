"""The fleet's prefix working set (loadaware.prefix.working_set), the KV capacity it is measured against
(scraped from vllm:cache_config_info), the policy that reads both (lane-spread), and the decision pipeline
that feeds it."""

from __future__ import annotations

import asyncio
import random

from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import RequestLifecycle
from loadaware.load.signals import SignalTracker
from loadaware.load.tracker import EngineStats, LoadTracker
from loadaware.load.vllm_metrics import kv_capacity_tokens, parse_vllm_gauges
from loadaware.policies import Candidate, make_policy
from loadaware.policies.lane import Lane
from loadaware.policies.lane_spread import LaneSpread, spreading
from loadaware.prefix.working_set import BLOCK_TOKENS, STRIDE, WorkingSet, fill_candidates, sampled_keys
from loadaware.routing.builder import build_decider
from loadaware.routing.pipeline import Decider
from loadaware.routing.request import InferenceRequest
from sim.metrics import EngineMetrics
from tests.unit.test_load_signals import Matches

SPAN = STRIDE * BLOCK_TOKENS  # tokens from one sampled block to the next


# ---- sampled keys ----
def test_sampled_keys_take_every_stride_th_full_block_chained_and_salted() -> None:
    tokens = list(range(3 * SPAN + BLOCK_TOKENS - 1))  # blocks 0, STRIDE, 2 x STRIDE full; 3 x STRIDE is not
    keys = sampled_keys(tokens)
    assert len(keys) == 3
    assert sampled_keys(tokens[:SPAN]) == keys[:1]
    changed = list(tokens)
    changed[1] += 1  # block 0: every later key chains on it
    assert all(a != b for a, b in zip(sampled_keys(changed), keys))
    changed = list(tokens)
    changed[SPAN] += 1  # block STRIDE
    assert sampled_keys(changed)[0] == keys[0] and sampled_keys(changed)[1:] != keys[1:]
    assert all(a != b for a, b in zip(sampled_keys(tokens, "tenant"), keys))
    assert sampled_keys(tokens[:BLOCK_TOKENS - 1]) == []


# ---- the estimator ----
def test_recurring_counts_blocks_routed_again_while_in_the_lru() -> None:
    ws = WorkingSet(stride=1, window=1.0)
    ws.set_capacity(4)  # the LRU spans 4 blocks
    ws.observe([1, 2], 2)
    assert ws.recurring == 0 and ws.blocks == 2
    ws.observe([1, 3], 2)
    assert ws.recurring == 1 and ws.recurring_blocks() == 1
    ws.observe([4, 5, 6], 3)  # 6 blocks: 2 and then 1, the oldest, leave, and 1's recurrence with it
    assert ws.recurring == 0 and list(ws._lru) == [3, 4, 5, 6] and ws.blocks == 4
    ws.observe([4, 5], 2)
    assert ws.recurring == 2


def test_a_key_stands_for_the_blocks_up_to_the_next_sampled_one_and_demand_waits_for_known_heads() -> None:
    ws = WorkingSet(stride=2, window=2.0)
    ws.observe([10, 11], 4)  # blocks 0-1 and 2-3
    ws.observe([10, 11], 4)
    assert ws.demand() is None  # no capacity known
    ws.set_capacity(40)
    assert ws.recurring_blocks() == 4 and ws.demand() == 4 / 40
    ws.observe([20, 21], 3)  # a 3-block prompt: its last key stands for block 2 alone
    assert ws.blocks == 4 + 3 and ws.singletons == 1 and ws.demand() is None  # a new head: may be growing
    ws.observe([20], 1)  # head 20 seen twice, now for 1 block
    assert ws.singletons == 0 and ws.recurring_blocks() == 5 and ws.demand() == 5 / 40


def test_head_eviction_forgets_its_singleton() -> None:
    ws = WorkingSet(stride=1, max_entries=2)
    for head in (1, 2, 3):
        ws.observe([head], 1)
    assert len(ws._heads) == 2 and ws.singletons == 2
    ws.observe([2], 1)
    ws.observe([3], 1)
    assert ws.singletons == 0


def test_a_larger_fleet_raises_the_sampling_rate_and_recounts() -> None:
    ws = WorkingSet(stride=1, window=1.0, max_entries=8)
    ws.set_capacity(8)
    keys = list(range(8))
    ws.observe(keys, 8)
    ws.observe(keys, 8)
    assert (ws.mod, ws.recurring, ws.recurring_blocks()) == (1, 8, 8)
    ws.set_capacity(32)  # would need 32 entries: keep keys divisible by 4 only
    assert ws.mod == 4 and sorted(ws._lru) == [0, 4] and (ws.blocks, ws.recurring) == (2, 2)
    assert ws.recurring_blocks() == 8  # each kept key stands for 4
    ws.observe([5, 8], 2)  # 5 is not sampled
    assert 5 not in ws._lru and ws._lru[8] >> 8 == 1


def test_the_sample_follows_the_count_over_every_block_from_above() -> None:
    """Prompts of 40 shared prefixes (6-200 blocks, Zipf-like reuse) with unique tails of 0-40 blocks, in a
    fleet smaller than the prefixes: the recurring blocks sampled every 16th block stay at or above the count
    over every block (stride 1), within half again: a sampled key straddling a prefix's end counts its tail as
    recurring. Over-counting closes lane-spread's gate early (it then scores as lane), never late."""
    rng = random.Random(7)
    prefixes = [[rng.getrandbits(62) for _ in range(rng.randint(6, 200))] for _ in range(40)]
    exact, sampled = WorkingSet(stride=1), WorkingSet(stride=STRIDE)
    for ws in (exact, sampled):
        ws.set_capacity(3_000)
    for i in range(3_000):
        tail = [rng.getrandbits(62) for _ in range(rng.randint(0, 40))]
        chain = prefixes[min(int(rng.paretovariate(1.0)) - 1, 39)] + tail
        exact.observe(chain, len(chain))
        sampled.observe(chain[::STRIDE], len(chain))
        if i % 500 == 499:
            assert exact.recurring_blocks() <= sampled.recurring_blocks() <= 1.5 * exact.recurring_blocks()
    assert exact.recurring_blocks() > 1_000


def test_popularity_reads_the_deepest_sampled_key_inside_the_match() -> None:
    ws = WorkingSet(stride=2, window=1.0)
    ws.set_capacity(100)
    for _ in range(3):
        ws.observe([1, 2, 3], 6)
    ws.observe([1, 2, 9], 6)
    keys = [1, 2, 3]  # sampled blocks 0, 2, 4
    assert ws.popularity(keys, 0) == 0
    assert ws.popularity(keys, 1) == ws.popularity(keys, 2) == 4  # blocks 0-1 held: block 0's key
    assert ws.popularity(keys, 3) == 4  # block 2's key
    assert ws.popularity(keys, 5) == ws.popularity(keys, 50) == 3  # block 4's key, the deepest sampled
    cands = (Candidate("a", 5 * BLOCK_TOKENS, 0.0), Candidate("b", 0, 0.0))
    fill_candidates(cands, ws, keys)
    assert [(c.cache_demand, c.prefix_routes) for c in cands] == [(ws.demand(), 3.0)] * 2


# ---- the capacity the engines state ----
CONFIG_LINE = ('vllm:cache_config_info{_block_size_resolved="True",block_size="32",effective_attention_block_size='
               '"64",engine="0",kv_cache_size_tokens="999",num_gpu_blocks="100",num_gpu_blocks_override="None"} 1.0')


def test_capacity_is_num_gpu_blocks_times_block_size_by_exact_label_names() -> None:
    assert kv_capacity_tokens(CONFIG_LINE) == 3200
    assert kv_capacity_tokens(CONFIG_LINE.replace('num_gpu_blocks="100"', 'num_gpu_blocks="None"')) == 999
    assert kv_capacity_tokens('vllm:cache_config_info{num_gpu_blocks="None",block_size="16"} 1.0') is None
    assert kv_capacity_tokens('vllm:cache_config_info{num_gpu_blocks="inf",block_size="16"} 1.0') is None
    two = CONFIG_LINE + "\n" + CONFIG_LINE.replace('engine="0"', 'engine="1"')
    assert parse_vllm_gauges(two) == {"kv_capacity_tokens": 6400}  # a server's engines add up


def test_the_simulated_engine_states_its_capacity() -> None:
    page = EngineMetrics("m", lambda: {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0,
                                       "vllm:kv_cache_usage_perc": 0.0}, (5625, 16)).render()
    assert parse_vllm_gauges(page)["kv_capacity_tokens"] == 90_000


def test_the_fleet_capacity_follows_scrapes_and_departures() -> None:
    loads = LoadTracker(stale_s=5)
    assert loads.kv_capacity_tokens() == 0
    loads.record("a", EngineStats(0, 0, None, 0.0, kv_capacity_tokens=1000))
    loads.record("b", EngineStats(0, 0, None, 0.0, kv_capacity_tokens=500))
    loads.record("b", EngineStats(0, 0, None, 0.0))  # a page that does not say keeps the last statement
    assert loads.kv_capacity_tokens() == 1500
    loads.record("b", EngineStats(0, 0, None, 0.0, kv_capacity_tokens=700))
    loads.drop("a")
    assert loads.kv_capacity_tokens() == 700


# ---- the policy ----
def _fleet(demand: float | None, routes: float) -> list[Candidate]:
    # The prefix holder has a queue (load 4, nothing decoding yet); its peer is idle.
    return [Candidate("holder", 1000, 4.0, cache_demand=demand, prefix_routes=routes, lane_wait_s=0.05),
            Candidate("peer", 0, 0.0, cache_demand=demand, prefix_routes=routes)]


def test_lane_spread_counts_every_request_in_flight_only_while_spreading() -> None:
    policy, lane = LaneSpread(), Lane()
    for demand, routes in ((None, 10.0), (1.0, 10.0), (0.5, 1.0)):  # unknown, full, or not popular: lane
        fleet = _fleet(demand, routes)
        assert not spreading(fleet)
        assert policy.costs(1200, fleet) == lane.costs(1200, fleet)
        assert policy.choose(1200, fleet).index == 0  # type: ignore[union-attr]
    fleet = _fleet(0.5, 2.0)
    assert spreading(fleet)
    assert policy.choose(1200, fleet).index == 1  # type: ignore[union-attr]  # a second copy, not a queue
    assert make_policy("lane-spread").name == "lane-spread"


# ---- the pipeline feeds it ----
FLEET = ("127.0.0.2:8000", "127.0.0.3:8000")


def _decider(loads: LoadTracker) -> Decider:
    lifecycle = RequestLifecycle()
    lifecycle.subscribe(loads)
    return build_decider(make_policy("lane-spread"), EndpointRegistry(FLEET), loads, lifecycle,
                   prefix_source=Matches({FLEET[0]: 2 * SPAN}), signals=SignalTracker())


def test_the_pipeline_fills_the_candidates_and_counts_only_routed_requests() -> None:
    loads = LoadTracker(stale_s=5)
    decider = _decider(loads)
    ws = decider.working_set
    assert ws is not None
    tokens = list(range(3 * SPAN))
    request = InferenceRequest("completions", prompt=tokens, model="m")
    first = asyncio.run(decider.decide(request, "r1"))
    assert {c.cache_demand for c in first.candidates} == {None}  # no capacity scraped yet
    loads.record(FLEET[0], EngineStats(0, 0, None, 0.0, kv_capacity_tokens=100 * SPAN))
    preview = asyncio.run(decider.decide(request, "x", count=False))
    assert ws.state()["heads"] == 1 and ws._lru[sampled_keys(tokens)[0]] >> 8 == 1  # Explain changed nothing
    assert {c.prefix_routes for c in preview.candidates} == {1.0}  # block 2 x STRIDE's key: held, routed once
    second = asyncio.run(decider.decide(request, "r2"))
    # Capacity known, but the prompt's head has been seen once: the working set may still be growing.
    assert second.reasons == () and {c.cache_demand for c in second.candidates} == {None}
    third = asyncio.run(decider.decide(request, "r3"))
    # 3 sampled keys seen twice, each for STRIDE blocks, over 100 x STRIDE blocks of capacity
    assert {(c.cache_demand, c.prefix_routes) for c in third.candidates} == {(0.03, 2.0)}
    assert ws.capacity_blocks == 100 * STRIDE


def test_a_failing_capacity_read_degrades_to_lane_and_says_so() -> None:
    loads = LoadTracker(stale_s=5)
    decider = _decider(loads)

    def broken() -> float:
        raise RuntimeError("boom")

    decider.data._fleet_capacity = broken
    d = asyncio.run(decider.decide(InferenceRequest("completions", prompt=list(range(2 * SPAN)), model="m"), "r"))
    assert d.endpoint is not None and "working_set_error" in d.reasons
    assert {(c.cache_demand, c.prefix_routes) for c in d.candidates} == {(None, 0.0)}


def test_the_cost_bench_exercises_the_working_set() -> None:
    """research.probes.working_set_cost measures a sidecar whose decisions really feed and read the working set."""
    from research.probes.working_set_cost import run, table

    result = run(quick=True)
    state = result["working_set"]
    assert state["capacity_blocks"] == 3 * 90_000 / BLOCK_TOKENS and state["heads"] == 1
    # one prompt, routed again and again: every block of it recurs
    assert state["recurring_blocks"] == result["direct_us"]["prompt_tokens"] // BLOCK_TOKENS and state["demand"] > 0
    assert "lane-spread's working set" in table(result)
