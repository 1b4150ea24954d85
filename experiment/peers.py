"""The peers' published routing policies, as experiment arms: our own code from their formulas.

Each is a pure function of `loadaware.policies.base.Candidate` signals, like the sidecar's policies, so the
simulator scores them on the same facts. Sources (docs/results.md names them too):

- lmetric: LMetric (arXiv 2603.15202), as NVIDIA Dynamo's `lmetric` selection ships it:
  cost = adjusted_prefill x (decode + 1), lowest wins; adjusted_prefill = uncached prompt tokens queued for
  prefill on the endpoint plus the request's own uncached tokens, decode = requests decoding there.
- dynamo: NVIDIA Dynamo KV router's default linear cost (lib/kv-router, temperature 0):
  cost = prefill_load_scale x max(active_prefill_blocks + incoming_blocks - overlap_blocks, 0)
         + active_decode_blocks + incoming_blocks, prefill_load_scale = 1, overlap credit 1 per block.
- llmd-token: llm-d Router's default since Aug 2026: `prefix-cache-affinity-filter` keeps the endpoints
  holding >= 0.8 of the prompt unless they carry more than maxTokensInFlightPenalty = 286,720 uncached
  tokens in flight, then `token-load-scorer`: uncached tokens in flight + prompt x (1 - hit), lowest wins.
- llmd-blend: llm-d's earlier weighted default: 3 x prefix-cache-scorer (hit fraction) + 2 x queue-scorer
  (waiting queue, min-max normalised over the candidates: (max - q) / (max - min), 1 when all equal) +
  2 x kv-cache-utilization-scorer (1 - KV usage); highest wins.
- sglang-cache-aware: SGLang router `cache_aware` (cache_threshold 0.3, balance_abs_threshold 64,
  balance_rel_threshold 1.5): when max - min in-flight > 64 and max > 1.5 x min, the shortest queue;
  otherwise the longest prefix match if its match rate > 0.3, else the endpoint with the smallest radix tree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from experiment.tree_signals import tree
from loadaware.policies.base import Candidate, Choice, Needs, argmax_with_tiebreak, lowest_cost

BLOCK_TOKENS = 16  # vLLM's block size in the simulated fleet


def _hit(c: Candidate, prompt_tokens: int) -> float:
    return min(1.0, c.matched_tokens / prompt_tokens) if prompt_tokens > 0 else 0.0


def _uncached(c: Candidate, prompt_tokens: int) -> float:
    return float(max(0, prompt_tokens - c.matched_tokens))


@dataclass
class LMetric:
    name: str = "lmetric"
    formula: ClassVar[str] = "cost(i) = (prefill_tokens(i) + uncached(i)) x (decode_batch(i) + 1); lowest wins"
    needs: ClassVar[Needs] = Needs(signals=True)

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> Choice | None:
        if not candidates:
            return None
        return lowest_cost([(c.prefill_tokens + _uncached(c, prompt_tokens)) * (c.decode_batch + 1)
                             for c in candidates], candidates)


@dataclass
class DynamoLinear:
    prefill_load_scale: float = 1.0
    overlap_credit: float = 1.0
    name: str = "dynamo"
    formula: ClassVar[str] = ("cost(i) = prefill_load_scale x max(active_prefill_blocks(i) + incoming_blocks - "
                              "overlap_blocks(i), 0) + active_decode_blocks(i) + incoming_blocks; lowest wins")
    needs: ClassVar[Needs] = Needs(signals=True)

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> Choice | None:
        if not candidates:
            return None
        incoming = math.ceil(prompt_tokens / BLOCK_TOKENS)
        costs = []
        for c in candidates:
            overlap = self.overlap_credit * (c.matched_tokens // BLOCK_TOKENS)
            prefill = c.prefill_tokens / BLOCK_TOKENS + incoming - overlap
            costs.append(self.prefill_load_scale * max(prefill, 0.0) + tree(c).kv_blocks + incoming)
        return lowest_cost(costs, candidates)


@dataclass
class LlmdTokenAware:
    affinity_threshold: float = 0.8
    max_tokens_in_flight_penalty: float = 286_720
    name: str = "llmd-token"
    formula: ClassVar[str] = ("keep endpoints with hit >= 0.8 and uncached tokens in flight <= 286,720 (all if "
                              "none); cost(i) = uncached_tokens(i) + prompt x (1 - hit(i)); lowest wins")
    needs: ClassVar[Needs] = Needs(signals=True)

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> Choice | None:
        if not candidates:
            return None
        sticky = [_hit(c, prompt_tokens) >= self.affinity_threshold
                  and c.uncached_tokens <= self.max_tokens_in_flight_penalty for c in candidates]
        keep = sticky if any(sticky) else [True] * len(candidates)
        costs = [c.uncached_tokens + prompt_tokens * (1 - _hit(c, prompt_tokens)) if k else math.inf
                 for c, k in zip(candidates, keep)]
        return lowest_cost(costs, candidates)


@dataclass
class LlmdBlend:
    prefix_weight: float = 3.0
    queue_weight: float = 2.0
    kv_weight: float = 2.0
    name: str = "llmd-blend"
    formula: ClassVar[str] = ("score(i) = 3 x hit(i) + 2 x (max_q - q(i)) / (max_q - min_q) + 2 x (1 - kv_usage(i)); "
                              "highest wins")
    needs: ClassVar[Needs] = Needs(signals=True)
    uses_gauges: ClassVar[bool] = True  # reads kv_usage

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> Choice | None:
        if not candidates:
            return None
        qs = [c.waiting for c in candidates]
        lo, hi = min(qs), max(qs)
        scores = []
        for c in candidates:
            queue = 1.0 if hi == lo else (hi - c.waiting) / (hi - lo)
            kv = 1.0 - (c.kv_usage or 0.0)
            scores.append(self.prefix_weight * _hit(c, prompt_tokens) + self.queue_weight * queue
                          + self.kv_weight * kv)
        return Choice(argmax_with_tiebreak(scores, candidates), tuple(scores))


@dataclass
class SglangCacheAware:
    cache_threshold: float = 0.3
    balance_abs_threshold: float = 64
    balance_rel_threshold: float = 1.5
    name: str = "sglang-cache-aware"
    formula: ClassVar[str] = ("imbalanced (max - min load > 64 and max > 1.5 x min): lowest load; else the longest "
                              "match if its rate > 0.3, else the smallest tree")
    needs: ClassVar[Needs] = Needs(signals=True)

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> Choice | None:
        if not candidates:
            return None
        loads = [c.load for c in candidates]
        hi, lo = max(loads), min(loads)
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            return lowest_cost(loads, candidates)
        best = max(range(len(candidates)), key=lambda i: (candidates[i].matched_tokens, -i))
        if _hit(candidates[best], prompt_tokens) > self.cache_threshold:
            scores = [float(c.matched_tokens) for c in candidates]
            return Choice(argmax_with_tiebreak(scores, candidates), tuple(scores))
        return lowest_cost([tree(c).routed_tokens for c in candidates], candidates)


PEER_POLICIES = {"lmetric": LMetric, "dynamo": DynamoLinear, "llmd-token": LlmdTokenAware,
                 "llmd-blend": LlmdBlend, "sglang-cache-aware": SglangCacheAware}
