"""The simulated engine without HTTP: scheduler, GPU prefix cache, LMCache store, timing, metrics.

One request: wait for a slot (FIFO, `max_num_seqs`), match the GPU prefix cache and the LMCache store at
admission, sleep the prefill time of what is neither (plus the LMCache load time), cache the prompt (and
report new LMCache chunks to the controller), emit the first token, then one decode step per further token
with the step time of the batch running at that moment.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loadaware.load.scraped.core import KV_USAGE, RUNNING, WAITING
from sim.held_blocks import HeldBlocks, private_blocks
from sim.lmcache_chunks import LMCacheStore
from sim.lmcache_reporter import LMCacheReporter
from sim.metrics import EngineMetrics
from sim.prefix_cache import Block, PrefixCache, iter_blocks
from sim.scheduler import Scheduler
from sim.service_model import PrefillLane, ServiceModel, split_prompt

log = logging.getLogger(__name__)

# Output is filler drawn from the vocabulary in a fixed order, so responses are deterministic.
FILLER_WORDS = ("the", "cache", "engine", "token", "model", "prefix", "router", "load", "balance", "query",
                "answer", "document", "context", "summary", "latency", "batch")


@dataclass
class EngineStats:
    served: int = 0  # requests that completed
    aborted: int = 0  # requests that ended early (client gone, injected abort)
    failed: int = 0  # x-sim-fail injections


@dataclass
class Phantom:
    running: int = 0
    waiting: int = 0


class EngineCore:
    def __init__(self, name: str, model_id: str, service: ServiceModel, filler: Sequence[str],
                 reporter: LMCacheReporter | None = None) -> None:
        self.name = name
        self.model_id = model_id
        self.service = service
        self.filler = list(filler) or ["x"]
        self.scheduler = Scheduler(service.max_num_seqs)
        self.prefix_cache = PrefixCache(service.kv_capacity_blocks, service.block_size)
        self.lmcache = LMCacheStore(service.lmcache_capacity_chunks)
        self.reporter = reporter
        self.phantom = Phantom()
        self.stats = EngineStats()
        self.metrics = EngineMetrics(model_id, self.gauges, (service.kv_capacity_blocks, service.block_size))
        self._held = HeldBlocks()  # KV blocks the admitted requests reference (vllm:kv_cache_usage_perc)
        self._prefill_lane = PrefillLane()

    # ---- reported state --------------------------------------------------------------------------------
    def gauges(self) -> dict[str, float]:
        """The load gauges the sidecar scrapes, named as its table of scraped signals names them
        (loadaware/load/scraped/); the page renders each with the table's help text."""
        return {
            RUNNING.gauge: self.scheduler.running + self.phantom.running,
            WAITING.gauge: self.scheduler.waiting + self.phantom.waiting,
            KV_USAGE.gauge: self._held.usage(self.service.kv_capacity_blocks),
        }

    def state(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model_id,
            "running": self.scheduler.running,
            "waiting": self.scheduler.waiting,
            "phantom": {"running": self.phantom.running, "waiting": self.phantom.waiting},
            "cached_blocks": len(self.prefix_cache),
            "lmcache_chunks": len(self.lmcache),
            "lmcache_registered": bool(self.reporter and self.reporter.registered),
            "served": self.stats.served,
            "aborted": self.stats.aborted,
            "failed": self.stats.failed,
            "prompt_tokens_total": self.metrics.prompt_tokens,
            "prefix_cache_hits_total": self.metrics.prefix_cache_hits,
        }

    def reset_cache(self) -> dict[str, int]:
        blocks = self.prefix_cache.clear()
        evicted = self.lmcache.clear()
        if self.reporter is not None:
            self.reporter.evict(evicted)
        return {"cleared_blocks": blocks, "evicted_chunks": len(evicted)}

    # ---- one request -----------------------------------------------------------------------------------
    async def generate(self, prompt: Sequence[int], max_tokens: int,
                       on_admit: Callable[[int], None] | None = None) -> AsyncGenerator[str, None]:
        """Yields the output text token by token with the model's timing. Closing it early frees the slot.
        `on_admit` hears, at admission, the prompt tokens served from a cache (vLLM's `num_cached_tokens`)."""
        loop = asyncio.get_running_loop()
        arrival = loop.time()
        svc, bs = self.service, self.service.block_size
        n = len(prompt)
        async with self.scheduler.slot():
            admitted_at = loop.time()
            self.metrics.queue_time.observe(admitted_at - arrival)
            blocks = iter_blocks(prompt, bs)  # hashed once: matched now, cached after the prefill
            keys = [b.key for b in blocks]
            gpu_hit = self.prefix_cache.match_keys(keys)
            lm_hit = self.lmcache.match(prompt)
            computed, loaded = split_prompt(n, gpu_hit, lm_hit)
            if on_admit is not None:
                on_admit(n - computed)
            self.metrics.prefix_cache_queries += n
            self.metrics.prefix_cache_hits += min(gpu_hit, n - computed)
            # From admission the request references every block of its prompt (vLLM allocates them when it
            # schedules the prefill); full blocks shared with other in-flight requests count once.
            held = self._held
            held.hold(keys)
            own = private_blocks(n, 0, bs)
            held.private += own
            produced = 0
            finished = False
            try:
                duration = svc.prefill_seconds(computed, loaded)
                if svc.serialize_prefill:
                    now = loop.time()
                    duration = self._prefill_lane.reserve(now, duration) - now
                await asyncio.sleep(duration)
                first = svc.first_token_seconds(self.scheduler.running)
                if first:
                    await asyncio.sleep(first)
                self._cache_prompt(prompt, blocks)
                self.metrics.prompt_tokens += n
                for i in range(max_tokens):
                    if i > 0:
                        pending = self._prefill_lane.free_at - loop.time() if svc.serialize_prefill else 0.0
                        await asyncio.sleep(svc.decode_step_seconds(self.scheduler.running, pending))
                    produced += 1
                    self.metrics.generation_tokens += 1
                    if i == 0:
                        self.metrics.ttft.observe(loop.time() - arrival)
                    grown = private_blocks(n, produced, bs) - own
                    if grown > 0:
                        held.private += grown
                        own += grown
                    yield self.filler[i % len(self.filler)]
                finished = True
            finally:
                held.private -= own
                held.release(keys)
                if finished:
                    self.stats.served += 1
                    self.metrics.request_success += 1
                    self.metrics.e2e.observe(loop.time() - arrival)
                else:
                    self.stats.aborted += 1

    def _cache_prompt(self, prompt: Sequence[int], blocks: Sequence[Block]) -> None:
        self.prefix_cache.insert_blocks(blocks)
        admitted, evicted = self.lmcache.admit(prompt)
        if self.reporter is not None and (admitted or evicted):
            self.reporter.report(admitted, evicted)


def filler_texts(decode_one: Any, encode: Any) -> list[str]:
    """Texts of single-token filler words (skipping any word the tokenizer splits)."""
    out = []
    for word in FILLER_WORDS:
        ids = encode(" " + word)
        if len(ids) == 1:
            out.append(decode_one(ids[0]))
    return out or [" the"]
