"""Discrete-event simulator: engine timing as sim.engine_core defines it, prefix credit modes, smoke run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

import research.arms  # noqa: F401 - registers the research arms this file runs ("lane")
from experiment.calibration import CALIBRATED, fleet_flags
from experiment.des import SIDECAR_ARMS, FleetConfig, Prepared, Simulation, _Req, arm_by_name, prepare, simulate
from experiment.metrics import seed_metrics
from experiment.workload import WorkloadSpec, build
from loadaware.lifecycle import Decision
from loadaware.load.tracker import EngineStats, LoadTracker
from loadaware.policies import Policy
from loadaware.policies.base import Candidate, Choice
from sim.service_model import ServiceModel

TINY = WorkloadSpec(n_prefixes=8, n_requests=40, rate=8.0, max_tokens=8)


@pytest.fixture(scope="module")
def tiny() -> Prepared:
    return prepare(build(TINY, 1))


def test_one_request_follows_the_engine_models_timing() -> None:
    svc = ServiceModel(prefill_tokens_per_s=10_000, prefill_overhead_ms=5, decode_base_ms=10,
                       decode_per_seq_ms=1, ttft_decode_steps=1.0)
    spec = replace(TINY, n_requests=1, warmup_passes=0)
    prepared = prepare(build(spec, 1))
    run = simulate(prepared, arm_by_name("kvaware"), FleetConfig(engines=2, service=svc))
    (r,) = run.requests
    n = r.prompt_tokens
    prefill = svc.prefill_seconds(n)  # cold: everything computed
    assert r.ttft == pytest.approx(prefill + svc.decode_step_seconds(1))
    assert r.itl == pytest.approx([svc.decode_step_seconds(1)] * 7)
    assert r.output_tokens == 8 and r.ok and r.engine == "engine-000"


def test_prefills_queue_on_the_lane_and_stall_decodes() -> None:
    svc = ServiceModel(prefill_tokens_per_s=1000, prefill_overhead_ms=0, decode_base_ms=10, decode_per_seq_ms=0,
                       prefill_chunk_tokens=20)
    spec = replace(TINY, n_requests=2, warmup_passes=0, rate=1e6)  # both arrive together
    prepared = prepare(build(spec, 1))
    run = simulate(prepared, arm_by_name("roundrobin"), FleetConfig(engines=1, service=svc))
    a, b = sorted(run.requests, key=lambda r: r.first_token_t or 0)
    n = a.prompt_tokens
    assert a.ttft == pytest.approx(n / 1000, rel=1e-3)
    assert a.first_token_t is not None and b.first_token_t is not None
    assert b.first_token_t - a.first_token_t == pytest.approx(n / 1000, rel=1e-3)  # behind a on the lane
    # a's first decode step starts while b still prefills: it carries one 20-token chunk (20 ms).
    assert a.itl[0] == pytest.approx(0.010 + 0.020)
    assert b.itl[-1] == pytest.approx(0.010)


def test_single_holder_credit_goes_to_the_first_registered_engine(tiny: Prepared) -> None:
    sim = Simulation(tiny, arm_by_name("kvaware"), FleetConfig(engines=2, credit="single"))
    req = tiny.warmup[0]
    for e in sim.engines:
        e.lmcache.admit_keys(req.chunks)
    assert sim._matches(req) == {"engine-000": len(req.chunks) * 256}
    sim.engines[0].lmcache.clear()
    assert sim._matches(req) == {"engine-001": len(req.chunks) * 256}
    multi = Simulation(tiny, arm_by_name("kvaware"), FleetConfig(engines=2, credit="multi"))
    for e in multi.engines:
        e.lmcache.admit_keys(req.chunks)
    assert multi._matches(req) == {"engine-000": len(req.chunks) * 256, "engine-001": len(req.chunks) * 256}


def test_gpu_credit_reads_each_engines_own_prefix_cache_not_the_lmcache_stores(tiny: Prepared) -> None:
    sim = Simulation(tiny, arm_by_name("kvaware"), FleetConfig(engines=2, credit="gpu"))
    req = tiny.warmup[0]
    for e in sim.engines:
        e.lmcache.admit_keys(req.chunks)
    assert sim._matches(req) == {}  # the CPU stores hold it, no GPU does: a KV-events index credits nobody
    sim.engines[1].cache.insert_blocks(req.blocks[:5])
    assert sim._matches(req) == {"engine-001": 5 * 16}  # block depth, not 256-token chunks
    sim.engines[0].cache.insert_blocks(req.blocks)
    assert sim._matches(req) == {"engine-000": len(req.blocks) * 16, "engine-001": 80}
    short = replace(req, chunks=())  # shorter than one LMCache chunk: the GPU blocks still count
    assert sim._matches(short) == {"engine-000": len(req.blocks) * 16, "engine-001": 80}


def test_every_sidecar_arm_runs_deterministically_and_yields_sane_metrics(tiny: Prepared) -> None:
    fleet = FleetConfig(engines=2, service=CALIBRATED)
    for arm in SIDECAR_ARMS:
        m = seed_metrics(simulate(tiny, arm, fleet, seed=1))
        assert m.ok == 40 and m.errors == 0 and m.valid
        assert 0.5 < m.prefix_hit_rate <= 1536 / 1578 + 1e-9
        assert m.imbalance >= 1.0 and m.ttft_p95 >= m.ttft_p50 > 0 and m.itl_p50 > 0
    a = seed_metrics(simulate(tiny, arm_by_name("loadaware-b0.5"), fleet, seed=1))
    b = seed_metrics(simulate(tiny, arm_by_name("loadaware-b0.5"), fleet, seed=1))
    assert a == b


@dataclass(frozen=True)
class SeenDecision:
    loads: tuple[float, ...]  # what the policy saw per candidate: own counts refined by the scrapes
    own_counts: tuple[int, ...]  # the router's own in-flight counts at that moment
    chosen: int


class RecordingPolicy:
    """Passes every decision to the arm's policy and remembers what it was shown and what it chose."""

    def __init__(self, policy: Policy, loads: LoadTracker) -> None:
        self.policy = policy
        self.loads = loads
        self.name = policy.name
        self.needs = policy.needs
        self.seen: list[SeenDecision] = []

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate],
               mean_load: float | None = None) -> Choice | None:
        choice = self.policy.choose(prompt_tokens, candidates)
        assert choice is not None
        self.seen.append(SeenDecision(tuple(c.load for c in candidates),
                                      tuple(self.loads.count(c.endpoint) for c in candidates), choice.index))
        return choice


def test_router_scrapes_feed_the_sidecars_load_view(tiny: Prepared) -> None:
    lag_s = 0.2
    fleet = FleetConfig(engines=3, service=CALIBRATED, router_scrape_interval_s=0.5, router_scrape_lag_s=lag_s)
    sim = Simulation(tiny, arm_by_name("leastload"), fleet)
    applied: list[tuple[float, str, EngineStats]] = []  # (when applied, engine, the scrape)
    record = sim.loads.record

    def recording_record(endpoint: str, stats: EngineStats) -> None:
        applied.append((sim.now, endpoint, stats))
        record(endpoint, stats)

    sim.loads.record = recording_record  # type: ignore[method-assign]
    policy = RecordingPolicy(sim.policy, sim.loads)
    sim.router.decider.policy = policy  # type: ignore[assignment]
    m = seed_metrics(sim.run())
    assert m.ok == 40
    # The scrapes reached the router's load view: every engine's, each applied `lag` after it was taken,
    # carrying the engines' real load (not zeros), and the view holds the last of them.
    assert {endpoint for _, endpoint, _ in applied} == set(sim.endpoints)
    assert all(now == pytest.approx(stats.at + lag_s) for now, _, stats in applied)
    assert max(stats.running + stats.waiting for _, _, stats in applied) > 0
    last = {endpoint: stats for _, endpoint, stats in applied}
    assert all(sim.loads.stats(endpoint) == last[endpoint] for endpoint in sim.endpoints)
    # ...and they moved decisions: the policy saw loads its own counts alone would not give, and least-load
    # chose an engine whose own count was not the lowest, which only the scraped load can explain.
    assert any(seen.loads != tuple(map(float, seen.own_counts)) for seen in policy.seen)
    assert any(seen.own_counts[seen.chosen] > min(seen.own_counts) for seen in policy.seen)
    # Without scrapes the same router sees exactly its own counts.
    unscraped = Simulation(tiny, arm_by_name("leastload"), replace(fleet, router_scrape_interval_s=0.0))
    baseline = RecordingPolicy(unscraped.policy, unscraped.loads)
    unscraped.router.decider.policy = baseline  # type: ignore[assignment]
    unscraped.run()
    assert all(seen.loads == tuple(map(float, seen.own_counts)) for seen in baseline.seen)


def test_arm_names_and_fleet_flags() -> None:
    assert arm_by_name("loadaware-b0.25").beta == 0.25 and arm_by_name("loadaware-b1.0").beta == 1.0
    assert [a.name for a in SIDECAR_ARMS] == ["kvaware", "loadaware-b0", "loadaware-b0.5", "loadaware-b1.0",
                                              "loadaware-b2.0", "roundrobin", "leastload"]
    flags = fleet_flags()
    assert "--kv-capacity-tokens" in flags and "--prefill-chunk-tokens" in flags
    from sim.fleet import build_parser
    from sim.service_model import from_cli_args

    assert from_cli_args(build_parser().parse_args(flags)) == CALIBRATED  # real-time engines get the same model
    with pytest.raises(ValueError):
        arm_by_name("random")


def test_sim_model_key_entry_points_match_token_entry_points() -> None:
    from sim.lmcache_chunks import LMCacheStore, chunk_keys
    from sim.prefix_cache import PrefixCache, iter_blocks

    toks = list(range(1000))
    a, b = PrefixCache(100, 16), PrefixCache(100, 16)
    a.insert(toks)
    b.insert_blocks(iter_blocks(toks, 16))
    assert a.match(toks) == b.match_keys([blk.key for blk in iter_blocks(toks, 16)]) == 992
    s = LMCacheStore(10)
    s.admit(toks)
    assert s.match(toks) == s.match_keys(chunk_keys(toks)) == 768
    svc = ServiceModel(decode_base_ms=10, decode_per_seq_ms=1, prefill_chunk_tokens=100, prefill_tokens_per_s=1000,
                       ttft_decode_steps=2)
    assert svc.decode_step_seconds(4) == pytest.approx(0.014)
    assert svc.decode_step_seconds(4, pending_prefill_s=0.05) == pytest.approx(0.064)
    assert svc.decode_step_seconds(4, pending_prefill_s=5.0) == pytest.approx(0.114)  # at most one chunk
    assert svc.first_token_seconds(4) == pytest.approx(0.028)
    assert ServiceModel().first_token_seconds(4) == 0 and ServiceModel().decode_step_seconds(4, 9.0) == 0.005


@pytest.mark.parametrize("seen", [True, False])
def test_the_router_is_the_sidecars_pipeline_and_learns_only_what_its_response_path_shows(tiny: Prepared,
                                                                                         seen: bool) -> None:
    """Every decision is the sidecar's Decider's (experiment.product_router): its signal tracker books each
    engine's prefill clock, and learns TTFT only from first chunks, which a BUFFERED Envoy never shows."""
    fleet = FleetConfig(engines=2, service=CALIBRATED, response_seen=seen, router_scrape_interval_s=1.0)
    sim = Simulation(tiny, arm_by_name("lane"), fleet)
    decisions: list[object] = []
    sim.router.lifecycle.subscribe_progress(type("Seen", (), {"on_first_chunk": lambda _, d: decisions.append(d)})())
    m = seed_metrics(sim.run())
    assert m.ok == len(tiny.requests)
    signals = [sim.router.signals.get(ep) for ep in sim.endpoints]
    assert all(sig is not None for sig in signals)
    # lane learns its prefill clocks' models (from first chunks of requests decided on an idle clock); the TTFT
    # model over every request is learned only for a research arm that reads it (research.candidates)
    learned = sum(sig.prefill_clock.model.observations for sig in signals
                  if sig is not None and sig.prefill_clock.model is not None)
    assert all(sig is not None and sig.model is None for sig in signals)
    if seen:
        # every first token passed the sidecar, warm-up included, and the TTFT models learned from them
        assert len(decisions) == len(tiny.requests) + len(tiny.warmup) and learned > 0
        assert not sim.router.signals.estimating
    else:
        assert decisions == [] and learned == 0  # the models stay the prior
        assert sim.router.signals.estimating  # the prefill is retired by the engines' TTFT means instead
    # nothing leaks: every count the sidecar took was given back when its request ended
    assert sim.loads.total() == 0
    assert all(sig is not None and sig.prefill_tokens == sig.uncached_tokens == sig.decoding == 0 for sig in signals)


def test_the_approximate_source_is_the_sidecars_own_index(tiny: Prepared) -> None:
    fleet = FleetConfig(engines=2, service=CALIBRATED, credit="approx")
    sim = Simulation(tiny, arm_by_name("loadaware"), fleet)
    sim.run()
    approx = sim.router.approx
    assert approx is not None and approx.index.total_blocks > 0
    # what it credited is what the sidecar routed: each engine's guess holds the blocks of its requests
    assert sum(approx.index.blocks(ep) for ep in sim.endpoints) == approx.index.total_blocks
    # without a tokenizer an exact source sees no prompt: every decision is load-only
    blind = Simulation(tiny, arm_by_name("loadaware"), FleetConfig(engines=2, service=CALIBRATED, tokenizer=False))
    seen: list[Decision] = []
    blind.router.lifecycle.subscribe(type("Log", (), {"on_decided": lambda _, d: seen.append(d),
                                                      "on_served": lambda *_: None, "on_ended": lambda *_: None})())
    blind.run()
    assert blind.router.approx is None and len(seen) == len(tiny.requests) + len(tiny.warmup)
    assert all(d.prompt_tokens == 0 and "no_tokenizer" in d.reasons for d in seen)


def test_kv_usage_counts_the_blocks_admitted_requests_hold_not_the_idle_cache(tiny: Prepared) -> None:
    # vLLM's kv_cache_usage_perc (BlockPool.get_usage) counts blocks some request references; a cached prefix
    # block nobody references is free (evictable), and a prefix two requests share is one block.
    sim = Simulation(tiny, arm_by_name("kvaware"), FleetConfig(engines=1, service=CALIBRATED))
    e, req, bs = sim.engines[0], tiny.warmup[0], CALIBRATED.block_size
    cap = CALIBRATED.kv_capacity_blocks
    assert sim._kv_usage(e) == 0.0
    for _ in range(2):
        r = _Req(req, None)
        r.engine = e
        sim._admit(e, r, 0.0)
    partial = 1 if req.n_tokens % bs else 0
    assert len(req.block_keys) == req.n_tokens // bs
    assert sim._kv_usage(e) == pytest.approx((len(req.block_keys) + 2 * partial) / cap)
    # A whole run ends with warm caches and nothing in flight: the cache is full of prefixes, usage is 0.
    run = Simulation(tiny, arm_by_name("kvaware"), FleetConfig(engines=2, service=CALIBRATED))
    records = run.run()
    assert all(len(x.cache) > 0 and run._kv_usage(x) == 0.0 for x in run.engines)
    seen = [s.kv_usage for s in records.samples]
    assert 0.0 < max(seen) < 1.0


def test_lane_spread_sees_the_working_set_as_the_sidecar_feeds_it(tiny: Prepared) -> None:
    """The sidecar's pipeline samples each routed prompt into its working set, sized by the engines' KV capacity
    as their scrapes state it (vllm:cache_config_info)."""
    from loadaware.prefix.working_set import BLOCK_TOKENS

    sim = Simulation(tiny, arm_by_name("lane-spread"), FleetConfig(engines=2, service=CALIBRATED))
    ws = sim.router.decider.working_set
    assert ws is not None
    assert Simulation(tiny, arm_by_name("lane"), FleetConfig(engines=2, service=CALIBRATED)).router.decider \
        .working_set is None
    sim.run()
    assert ws.capacity_blocks == 2 * CALIBRATED.kv_capacity_tokens / BLOCK_TOKENS
    heads = ws.state()["heads"]
    assert isinstance(heads, int) and heads > 0 and ws.recurring > 0 and ws.demand() is not None


def test_the_buffered_estimate_is_measured_against_the_true_prefill_queue(tiny: Prepared) -> None:
    """research.prefill_error: the sidecar's BUFFERED estimate (its own tracker, no first chunk seen) beside
    the simulation's truth; it errs less than keeping every token until the end."""
    from research.prefill_error import BufferedView

    # long enough answers (64 tokens) that a request's end comes well after its first token, as at the reference
    work = prepare(build(WorkloadSpec(n_prefixes=8, n_requests=150, rate=16.0, max_tokens=64), 3))
    view = BufferedView(work, "loadaware", "reference", 0, 0.25)
    view.run()
    err = view.errors
    assert err.samples == len(work.requests) * len(view.engines) and err.truth > 0
    assert err.estimate < err.at_end
    assert view.router.signals.estimating  # no first chunk reached the sidecar
    assert all(v == 0 for v in view._truth.values()) and all(v == 0 for v in view._in_flight.values())
