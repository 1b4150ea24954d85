"""Discrete-event simulation of the reference experiment: no network, no clocks, seconds of CPU per seed.

It runs the SAME engine model as the real-time simulated engines and the SAME decision code as the sidecar:

- engine: `sim.engine_core.EngineCore`'s request life, event for event. FIFO admission up to
  `max_num_seqs` (the rest wait: vllm:num_requests_waiting); at admission the GPU prefix cache
  (`sim.prefix_cache.PrefixCache`, LRU over 16-token blocks, capacity `kv_capacity_tokens`) and the LMCache
  CPU store (`sim.lmcache_chunks.LMCacheStore`, 256-token chunks) are matched and `split_prompt` decides
  what is computed and what loaded; the prefill runs on the engine's FIFO prefill lane
  (`sim.service_model.PrefillLane`, `ServiceModel.prefill_seconds`); at its end the prompt is cached, the
  LMCache controller learns the new chunks, and the first token is out; every later token follows after
  `decode_step_seconds(running)` with `running` read when that step starts (so decode slows as the batch
  grows: the "decode-batch concentration" behind the reference's imbalance). Counters and gauges are
  EngineCore's: prefix_cache_queries/hits in tokens (GPU hits only), running, waiting, kv_cache_usage.
- router: the sidecar itself (`experiment.product_router`): its `Decider` builds the candidates and decides,
  its `LoadTracker` counts each request in flight from the decision to its end, refined by engine scrapes
  every `router_scrape_interval_s` that arrive `router_scrape_lag_s` late (every scrape also carries the
  engine's TTFT histogram totals and KV capacity, as vllm's page does), its `SignalTracker` keeps the token
  signals, TTFT models and prefill clocks from the same lifecycle events the ext_proc server emits (first
  chunks only when `response_seen`: the picker's full duplex; behind BUFFERED the tracker estimates), and the
  queued-prefix credit and working set are the pipeline's own.
- arms: the registry's (`experiment.arms`). What an arm reads beyond the candidates the sidecar's pipeline builds
  (the peers' tree signals, each engine's TTFT model over every request, the simulation itself) is what its
  entry declares (`Reads`); the simulation provides it and never asks a policy its type.
- peers: `experiment.peers`' published policies (LMetric, Dynamo, llm-d, SGLang) decide through the same
  pipeline on the same candidates; the two signals only they read (distinct KV blocks in flight, distinct
  blocks ever routed) are filled by the simulation; `FleetConfig.engine_services` gives engines their own
  service models (a heterogeneous fleet).
- prefix credit: "single" = stock LMCache 0.5.6 (`KVController.lookup`): the walk over 256-token chunks
  stops at the first chunk nobody holds and credits each chunk to the FIRST REGISTERED engine holding it
  (registration order = engine index), an engine's match being the end of its last credited chunk;
  "multi" = every holder credited with its own contiguous match in the LMCache CPU stores, as the reference's
  patched lookup does; "gpu" = every engine credited with its own GPU prefix-cache match (16-token blocks,
  LRU-evicted), as a KV-events index sees it (vLLM's KV events report every engine's GPU blocks, evictions
  included; the sidecar's `--prefix-source kv-events`, NVIDIA Dynamo's and llm-d's indexers read them; see
  docs/architecture.md, "Data sources"). Where the CPU stores hold every prefix and the GPU caches do not
  (2 engines, many prefixes), "multi" credits engines with prefixes they must load back at a miss's cost;
  "approx" = the sidecar's own approximate index (`loadaware.prefix.approx`) of what it routed. Without a
  tokenizer (`tokenizer=False`) the exact sources see no prompt at all and the approximate one counts text units.

Each prompt is hashed once per workload (`prepare`), not once per lookup: that and the per-engine step-time
table are what make 20 seeds x 7 arms run in seconds. See `experiment.des_run` for the CLI.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

# The arms' registry (experiment.arms); its names are re-exported here, where callers have long found them.
from experiment.arms import PEER_ARMS as PEER_ARMS
from experiment.arms import SIDECAR_ARMS as SIDECAR_ARMS
from experiment.arms import Arm as Arm
from experiment.arms import arm_by_name as arm_by_name
from experiment.product_router import ProductRouter, TwoArgPolicy
from experiment.records import EngineSample, RequestRecord, RunRecords
from experiment.tree_signals import TreeCandidate, with_tree
from experiment.workload import Request, Workload
from loadaware.lifecycle import Decision
from loadaware.load.tracker import EngineStats
from loadaware.policies import Policy
from loadaware.policies.base import Candidate
from sim.held_blocks import HeldBlocks, private_blocks
from sim.lmcache_chunks import LMCACHE_CHUNK_SIZE, LMCacheStore, chunk_keys
from sim.prefix_cache import Block, PrefixCache, block_key, iter_blocks
from sim.service_model import ServiceModel, split_prompt

Credit = Literal["single", "multi", "gpu", "approx"]


# ---- configuration -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FleetConfig:
    engines: int = 2
    service: ServiceModel = field(default_factory=ServiceModel)
    credit: Credit = "multi"  # the reference ran a multi-holder LMCache lookup patch
    sample_interval_s: float = 0.5  # the driver's scrape interval for metrics (imbalance, hit rate, KV)
    router_scrape_interval_s: float = 0.0  # 0: the router sees only its own in-flight counts (reference)
    router_scrape_lag_s: float = 0.0  # age of a scrape when the router applies it
    router_scrape_stale_s: float = 5.0  # the sidecar's --scrape-stale-s
    settle_s: float = 1.0  # idle gap between the drained warm-up and the first measured send
    # Per-engine service models by engine index (a heterogeneous fleet); engines beyond it run `service`.
    engine_services: tuple[ServiceModel, ...] = ()
    # The sidecar's deployment: does the response path show first chunks (the picker's full duplex: True; a
    # BUFFERED Envoy: False), and has it a tokenizer (without one the exact sources see no tokens and the
    # approximate one counts text units, modelled as 1.5 units per token: the workload's words average ~6 bytes
    # with their space, and a unit is 4 bytes)?
    response_seen: bool = True
    tokenizer: bool = True
    # The sidecar's own record of where it sent each prefix beside an exact source that names one holder per
    # chunk (stock LMCache, credit "single"): the sidecar's default with --lmcache-url and a tokenizer.
    approx_beside: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.engines <= 4096:
            raise ValueError("engines must be in 1..4096")
        if self.sample_interval_s <= 0:
            raise ValueError("sample_interval_s must be > 0")

    def service_of(self, i: int) -> ServiceModel:
        return self.engine_services[i] if i < len(self.engine_services) else self.service

    def endpoint(self, i: int) -> str:
        # Zero-padded so the sidecar's lexical tie-breaks and round-robin order follow the engine index.
        return f"engine-{i:03d}"


# ---- workload prepared for the simulator (hash each prompt once) ---------------------------------------
@dataclass(frozen=True, slots=True)
class SimRequest:
    index: int
    send_at: float
    wave: int
    prefix: int
    n_tokens: int
    max_tokens: int
    blocks: tuple[Block, ...]  # full 16-token blocks with chained keys (GPU prefix cache)
    block_keys: tuple[int, ...]
    chunks: tuple[int, ...]  # full 256-token LMCache chunk keys


@dataclass(frozen=True)
class Prepared:
    warmup: tuple[SimRequest, ...]
    requests: tuple[SimRequest, ...]
    offered_rate: float


def _blocks_from(tokens: Sequence[int], start: int, parent: int | None, bs: int) -> list[Block]:
    out = []
    for s in range(start, len(tokens) - bs + 1, bs):
        chunk = tuple(tokens[s : s + bs])
        key = block_key(parent, chunk)
        out.append(Block(key, parent, chunk))
        parent = key
    return out


def prepare(workload: Workload, block_size: int = 16) -> Prepared:
    """Block and chunk keys of every request. A prefix's shared full blocks are hashed once and reused."""
    shared_blocks = [tuple(iter_blocks(p, block_size)) for p in workload.prefix_ids]
    shared_chunks = [tuple(chunk_keys(p)) for p in workload.prefix_ids]

    def one(r: Request) -> SimRequest:
        pb = shared_blocks[r.prefix]
        parent = pb[-1].key if pb else None
        blocks = pb + tuple(_blocks_from(r.token_ids, len(pb) * block_size, parent, block_size))
        pc = shared_chunks[r.prefix]
        tail_start = len(pc) * LMCACHE_CHUNK_SIZE
        chunks = pc if len(r.token_ids) - tail_start < LMCACHE_CHUNK_SIZE else tuple(chunk_keys(r.token_ids))
        return SimRequest(r.index, r.send_at, r.wave, r.prefix, len(r.token_ids), r.max_tokens, blocks,
                          tuple(b.key for b in blocks), chunks)

    reqs = workload.requests
    span = reqs[-1].send_at - reqs[0].send_at if len(reqs) > 1 else 0.0
    rate = (len(reqs) - 1) / span if span > 0 else workload.spec.rate
    return Prepared(tuple(one(r) for r in workload.warmup), tuple(one(r) for r in reqs), rate)


# ---- the simulation ------------------------------------------------------------------------------------
_ARRIVE, _LANE_DONE, _PREFILL_DONE, _TOKEN, _SAMPLE, _SCRAPE, _APPLY = range(7)


class _Engine:
    __slots__ = ("active", "cache", "chunk_s", "held", "hits", "index", "kv_refs", "lane_free", "lmcache", "name",
                 "queries", "routed", "running", "served", "step", "svc", "ttft_count", "ttft_sum", "waiting")

    def __init__(self, name: str, index: int, svc: ServiceModel) -> None:
        self.name = name
        self.index = index
        self.svc = svc
        # decode_step_seconds for every batch size the scheduler allows (+1 for safety); a step that starts
        # while prefill work is queued on the lane also carries up to one chunk of it (`_gap`).
        self.step = [svc.decode_step_seconds(k) for k in range(svc.max_num_seqs + 2)]
        self.chunk_s = svc.prefill_chunk_tokens / svc.prefill_tokens_per_s if svc.serialize_prefill else 0.0
        # Signals only the peers' arms read (the sidecar tracks the rest itself: experiment.product_router).
        self.kv_refs = HeldBlocks()  # blocks of the requests in flight here, as the router counts them
        self.routed: set[int] = set()  # block keys ever routed here (an approximate radix tree)
        self.ttft_sum = 0.0  # the engine's TTFT histogram totals (vllm:time_to_first_token_seconds)
        self.ttft_count = 0
        self.cache = PrefixCache(svc.kv_capacity_blocks, svc.block_size)
        self.lmcache = LMCacheStore(svc.lmcache_capacity_chunks)
        self.lane_free = 0.0
        self.running = 0
        self.waiting: deque[_Req] = deque()
        self.active: set[_Req] = set()  # admitted: in prefill or decoding
        self.held = HeldBlocks()  # full prompt blocks the admitted requests reference (the engine's KV usage)
        self.queries = 0
        self.hits = 0
        self.served = 0


class _Req:
    __slots__ = ("decided_t", "decision", "engine", "last_t", "prefilled", "produced", "record", "sim")

    def __init__(self, sim: SimRequest, record: RequestRecord | None) -> None:
        self.sim = sim
        self.engine: _Engine | None = None
        self.decision: Decision | None = None  # the sidecar's record of the request (its lifecycle's events)
        self.record = record  # None for warm-up requests (not measured)
        self.produced = 0
        self.last_t = 0.0
        self.prefilled = False
        self.decided_t = 0.0


@dataclass
class EngineSeries:
    """Per-engine time series beyond the scrapes (for plots): every sample of running per engine."""

    t: list[float] = field(default_factory=list)
    running: dict[str, list[float]] = field(default_factory=dict)


class Simulation:
    """One arm on one fleet for one seed's workload. `run()` once; it returns what a real run records."""

    def __init__(self, prepared: Prepared, arm: Arm, config: FleetConfig, seed: int = 0) -> None:
        self.prepared = prepared
        self.arm = arm
        self.config = config
        self.seed = seed
        self.svc = config.service
        self.policy = arm.make()
        self.engines = [_Engine(config.endpoint(i), i, config.service_of(i)) for i in range(config.engines)]
        self._by_name = {e.name: e for e in self.engines}
        self.endpoints = tuple(e.name for e in self.engines)
        self.now = 0.0
        # What the arm reads beyond the sidecar's candidates is what its registry entry declares
        # (experiment.arms.Reads). The tree signals (blocks in flight, blocks ever routed), which the sidecar
        # does not track: the simulation fills them on the candidates the sidecar's pipeline built.
        reads = arm.reads
        self._peer = reads.tree_signals
        # The TTFT model over every request: the tracker learns it for this arm only (the sidecar does not),
        # and the entry's function adds its prices to the arm's candidates.
        ttft_prices = reads.ttft_models
        self.reads_ttft = ttft_prices is not None
        decides: Policy = self.policy
        if self._peer:
            decides = TwoArgPolicy(self.policy, self._peer_signals)
        elif ttft_prices is not None:
            decides = TwoArgPolicy(self.policy, lambda cs: ttft_prices(cs, self.router.signals))
        source = "approx" if config.credit == "approx" else "none" if not config.tokenizer else \
            "exact+approx" if config.approx_beside and config.credit == "single" else "exact"
        self.router = ProductRouter(decides, self.endpoints, lambda: self.now, source, ttft_model=self.reads_ttft)
        self.loads = self.router.loads
        self._decision: Decision | None = None  # the last decision, for _arrive to give its request
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._open = 0  # requests sent and not finished
        self._pending = 0  # arrivals not yet processed
        self.samples: list[EngineSample] = []
        self.records: list[RequestRecord] = []
        self._measuring = False
        self._measured_open = 0
        self._scrape_engines(0.0)  # the sidecar scrapes each engine as it joins (its KV capacity among others)
        if reads.simulation is not None:  # a design bound that reads engine speeds and the clock
            reads.simulation(self.policy, self)

    # ---- event queue ---------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    def _busy(self) -> bool:
        return self._open > 0 or self._pending > 0

    def _loop(self) -> None:
        heap = self._heap
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            t, _, kind, obj = pop(heap)
            self.now = t
            if kind == _TOKEN:  # the hot path: one event per output token
                r: _Req = obj  # type: ignore[assignment]
                r.produced += 1
                rec = r.record
                if rec is not None:
                    rec.itl.append(t - r.last_t)
                r.last_t = t
                if r.produced >= r.sim.max_tokens:
                    self._finish(r, t)
                else:
                    e = r.engine
                    gap = e.step[e.running]  # type: ignore[union-attr]
                    chunk_s = e.chunk_s  # type: ignore[union-attr]
                    if chunk_s and e.lane_free > t:  # type: ignore[union-attr]
                        pending = e.lane_free - t  # type: ignore[union-attr]
                        gap += pending if pending < chunk_s else chunk_s
                    self._seq += 1
                    push(heap, (t + gap, self._seq, _TOKEN, r))
            elif kind == _ARRIVE:
                self._arrive(obj, t)  # type: ignore[arg-type]
            elif kind == _LANE_DONE:
                self._lane_done(obj, t)  # type: ignore[arg-type]
            elif kind == _PREFILL_DONE:
                self._prefill_done(obj, t)  # type: ignore[arg-type]
            elif kind == _SAMPLE:
                self._sample(t)
                if self._measuring:
                    self._push(t + self.config.sample_interval_s, _SAMPLE, None)
            elif kind == _SCRAPE:
                self._push(t + self.config.router_scrape_lag_s, _APPLY, self._scrapes(t))
                if self._busy():
                    self._push(t + self.config.router_scrape_interval_s, _SCRAPE, None)
            elif kind == _APPLY:
                for name, stats in obj:  # type: ignore[attr-defined]
                    # The tracker judges staleness by the scrape's age: the engine state is `lag` old.
                    self.router.scraped(name, stats)
                self.router.expire()  # the approximate index's decay runs on the sidecar's 1 s tick too

    # ---- one request ---------------------------------------------------------------------------------
    def _arrive(self, r: _Req, t: float) -> None:
        self._pending -= 1
        self._open += 1
        if r.record is not None:
            r.record.send_t = t
        engine, matched = self._decide(r.sim)
        r.decision, self._decision = self._decision, None
        self._dispatch(r, engine, matched, t)

    def _dispatch(self, r: _Req, engine: _Engine, matched: int, t: float) -> None:
        """A decided request reaches its engine: admitted now if the engine has a free slot and nobody waits."""
        r.engine = engine
        r.decided_t = t
        self._track_decided(engine, r, matched, t)
        if r.record is not None:
            r.record.engine = engine.name
        if engine.running < engine.svc.max_num_seqs and not engine.waiting:
            self._admit(engine, r, t)
        else:
            engine.waiting.append(r)

    def _decide(self, s: SimRequest) -> tuple[_Engine, int]:
        """The sidecar's decision (experiment.product_router): its pipeline, policy and lifecycle listeners, on
        the prefix source's answer of this moment."""
        router = self.router
        if self.policy.needs.prefix and self.config.credit != "approx" and self.config.tokenizer:
            router.exact.answer = self._matches(s)
        decision = router.decide(self._tokens(s))
        self._decision = decision
        engine = self._by_name[decision.endpoint] if decision.endpoint is not None else self.engines[0]
        matched = next((c.matched_tokens for c in decision.candidates if c.endpoint == engine.name), 0)
        return engine, matched

    def _tokens(self, s: SimRequest) -> list[int] | None:
        """The prompt as the sidecar sees it: its token ids (the full blocks' own, the partial tail block's made
        up: no index keys a partial block); without a tokenizer, text units for the approximate source and
        nothing for an exact one."""
        if not self.config.tokenizer and self.config.credit != "approx":
            return None
        tokens = [tok for b in s.blocks for tok in b.tokens]
        tokens.extend(range(-1, -1 - (s.n_tokens - len(tokens)), -1))
        if self.config.tokenizer:
            return tokens
        # 1.5 text units per token (FleetConfig.tokenizer): an odd token id stands for 2 units, an even one for 1
        return [u for tok in tokens for u in ((2 * tok, 2 * tok + 1) if tok % 2 else (2 * tok,))]

    def _peer_signals(self, candidates: Sequence[Candidate]) -> list[TreeCandidate]:
        """The two signals only the peers' arms read: blocks in flight and blocks ever routed, per engine."""
        bs = self.svc.block_size
        out = []
        for c in candidates:
            e = self._by_name[c.endpoint]
            out.append(with_tree(c, kv_blocks=float(len(e.kv_refs)), routed_tokens=float(len(e.routed) * bs)))
        return out

    # ---- what only the peers' arms read (the sidecar's own signals follow its lifecycle) -------------------
    def _track_decided(self, e: _Engine, r: _Req, matched: int, t: float) -> None:
        if self._peer:
            e.kv_refs.hold(r.sim.block_keys)
            e.routed.update(r.sim.block_keys)

    def _track_ended(self, e: _Engine, r: _Req) -> None:
        if self._peer:
            e.kv_refs.release(r.sim.block_keys)

    def _matches(self, s: SimRequest) -> dict[str, int]:
        if self.config.credit == "gpu":
            gpu = {}
            for e in self.engines:
                m = e.cache.match_keys(s.block_keys)
                if m:
                    gpu[e.name] = m
            return gpu
        chunks = s.chunks
        if not chunks:
            return {}
        if self.config.credit == "multi":
            out = {}
            for e in self.engines:
                m = e.lmcache.match_keys(chunks)
                if m:
                    out[e.name] = m
            return out
        # Stock LMCache: chunk by chunk, the first registered holder takes the credit; stop at a gap.
        layout: dict[str, int] = {}
        end = 0
        for key in chunks:
            end += LMCACHE_CHUNK_SIZE
            for e in self.engines:
                if key in e.lmcache:
                    layout[e.name] = end
                    break
            else:
                break
        return layout

    def _admit(self, e: _Engine, r: _Req, t: float) -> None:
        svc, s = e.svc, r.sim
        e.running += 1
        e.active.add(r)
        e.held.hold(s.block_keys)
        n = s.n_tokens
        gpu_hit = e.cache.match_keys(s.block_keys)
        lm_hit = e.lmcache.match_keys(s.chunks)
        computed, loaded = split_prompt(n, gpu_hit, lm_hit)
        e.queries += n
        e.hits += min(gpu_hit, n - computed)
        duration = svc.prefill_seconds(computed, loaded)
        if svc.serialize_prefill:
            start = e.lane_free if e.lane_free > t else t
            done = e.lane_free = start + duration
        else:
            done = t + duration
        self._push(done, _LANE_DONE, r)

    def _lane_done(self, r: _Req, t: float) -> None:
        e = r.engine
        assert e is not None
        first = e.svc.first_token_seconds(e.running)
        if first:
            self._push(t + first, _PREFILL_DONE, r)
        else:
            self._prefill_done(r, t)

    def _prefill_done(self, r: _Req, t: float) -> None:
        e, s = r.engine, r.sim
        assert e is not None
        e.cache.insert_blocks(s.blocks)
        e.lmcache.admit_keys(s.chunks)  # the controller learns at once (ZMQ latency is ~ms, not modelled)
        r.prefilled = True
        r.produced = 1
        r.last_t = t
        e.ttft_sum += t - r.decided_t
        e.ttft_count += 1
        if self.config.response_seen and r.decision is not None:  # the picker's full duplex shows first chunks
            self.router.first_chunk(r.decision)
        if r.record is not None:
            r.record.first_token_t = t
        if s.max_tokens <= 1:
            self._finish(r, t)
        else:
            self._push(t + e.svc.decode_step_seconds(e.running, e.lane_free - t if e.chunk_s else 0.0),
                       _TOKEN, r)

    def _finish(self, r: _Req, t: float) -> None:
        e = r.engine
        assert e is not None
        e.active.discard(r)
        e.held.release(r.sim.block_keys)
        e.served += 1
        if r.decision is not None:
            self.router.ended(r.decision)
        self._track_ended(e, r)
        self._open -= 1
        rec = r.record
        if rec is not None:
            rec.end_t = t
            rec.ok = True
            rec.output_tokens = r.produced
            self._measured_open -= 1
        if e.waiting:  # hand the slot straight to the next waiter, as sim.scheduler does
            self._admit_next(e, t)
        else:
            e.running -= 1
        if rec is not None and self._measured_open == 0 and self._pending == 0:
            self._sample(t)  # the window's closing scrape
            self._measuring = False

    def _admit_next(self, e: _Engine, t: float) -> None:
        nxt = e.waiting.popleft()
        e.running -= 1  # _admit counts it again
        self._admit(e, nxt, t)

    # ---- observation ---------------------------------------------------------------------------------
    def _kv_usage(self, e: _Engine) -> float:
        """vllm:kv_cache_usage_perc (sim.held_blocks): the blocks the admitted requests hold, cached blocks no
        request holds excluded."""
        bs = e.svc.block_size
        private = sum(private_blocks(r.sim.n_tokens, r.produced, bs) for r in e.active)
        return e.held.usage(e.svc.kv_capacity_blocks, private)

    def _scrapes(self, t: float) -> list[tuple[str, EngineStats]]:
        """Each engine's page as the sidecar's scraper reads it: running, waiting, KV usage, the TTFT histogram's
        totals and the KV capacity (vllm:cache_config_info)."""
        return [(e.name, EngineStats(float(e.running), float(len(e.waiting)), self._kv_usage(e), t, e.ttft_sum,
                                     float(e.ttft_count), float(e.svc.kv_capacity_tokens))) for e in self.engines]

    def _scrape_engines(self, t: float) -> None:
        for name, stats in self._scrapes(t):
            self.router.scraped(name, stats)

    def _sample(self, t: float) -> None:
        if self.samples and self.samples[-1].t == t:
            return
        for e in self.engines:
            self.samples.append(EngineSample(t, e.name, float(e.running), float(len(e.waiting)),
                                             self._kv_usage(e), float(e.queries), float(e.hits)))

    # ---- phases --------------------------------------------------------------------------------------
    def _send(self, reqs: Iterable[SimRequest], t0: float, measured: bool) -> None:
        for s in reqs:
            rec = RequestRecord(s.index, t0 + s.send_at, prompt_tokens=s.n_tokens, prefix=s.prefix) \
                if measured else None
            if rec is not None:
                self.records.append(rec)
                self._measured_open += 1
            self._pending += 1
            self._push(t0 + s.send_at, _ARRIVE, _Req(s, rec))
        if self.config.router_scrape_interval_s > 0:
            self._push(t0, _SCRAPE, None)

    def run(self) -> RunRecords:
        # Warm-up through the router under test (the reference's two passes), each pass drained before
        # the next and the last drained before measuring.
        warm = self.prepared.warmup
        for wave in sorted({s.wave for s in warm}):
            self._send([s for s in warm if s.wave == wave], self.now, measured=False)
            self._loop()
        t0 = self.now + self.config.settle_s
        reqs = self.prepared.requests
        if reqs:
            start = t0 + reqs[0].send_at
            self._measuring = True
            self._sample(start - 1e-9)  # the window's opening scrape, before the first send
            self._push(start + self.config.sample_interval_s, _SAMPLE, None)
            self._send(reqs, t0, measured=True)
            self._loop()
        window = (self.records[0].send_t - 1e-9, max(r.end_t or 0.0 for r in self.records)) \
            if self.records else (0.0, 0.0)
        return RunRecords(self.arm.name, self.seed, self.records, self.samples, window,
                          self.prepared.offered_rate)


def simulate(prepared: Prepared, arm: Arm, config: FleetConfig, seed: int = 0) -> RunRecords:
    return Simulation(prepared, arm, config, seed).run()
