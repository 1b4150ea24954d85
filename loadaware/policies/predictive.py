"""Predicted-TTFT placement: each endpoint's learned TTFT model prices the request's own wait.

    cost(i) = ttft_i(prefill_tokens(i) + uncached(i), load(i))

ttft_i is the endpoint's online model (loadaware.policies.ttft_model): what the router has seen that
endpoint's first tokens take for a given prefill queue and load. Lowest wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from loadaware.policies.base import Candidate, Choice, argmax_with_tiebreak
from loadaware.policies.ttft_model import TtftPrior


@dataclass
class Predictive:
    prior: TtftPrior = field(default_factory=TtftPrior)
    k_batch: float = 0.0
    k_wait: float = 0.0
    k_bal: float = 0.0
    k_lmetric: float = 0.0
    k_lrel: float = 0.0
    k_kv: float = 0.0
    k_miss: float = 0.0
    uses_gauges: bool = False
    name: str = "predictive"
    formula: ClassVar[str] = ("cost(i) = base(i) + per_token(i) x (prefill_tokens(i) + uncached(i)) + per_running(i) "
                              "x load(i), each endpoint's learned TTFT model; lowest wins")
    uses_prefix: bool = True

    def costs(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
        p = self.prior
        out = []
        loads = [c.load for c in candidates]
        mean = sum(loads) / len(loads)
        scale = max(1.0, mean)
        dmean = max(1.0, sum(c.decode_batch for c in candidates) / len(candidates))
        for c in candidates:
            base = p.base_s if c.ttft_base_s is None else c.ttft_base_s
            per_token = p.per_token_s if c.ttft_per_token_s is None else c.ttft_per_token_s
            per_running = p.per_running_s if c.ttft_per_running_s is None else c.ttft_per_running_s
            uncached = max(0, prompt_tokens - c.matched_tokens)
            ahead = c.prefill_tokens + uncached
            cost = base + per_token * ahead + (1 + self.k_batch) * per_running * c.load
            cost += self.k_wait * c.waiting * per_running
            cost += self.k_bal * per_token * prompt_tokens * (c.load - mean) / scale
            cost += self.k_lmetric * per_token * ahead * c.decode_batch
            cost += self.k_lrel * per_token * ahead * c.decode_batch / dmean
            cost += self.k_kv * (c.kv_usage or 0.0) * per_token * c.matched_tokens
            cost += self.k_miss * per_token * uncached
            out.append(cost)
        return out

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> Choice | None:
        if not candidates:
            return None
        scores = [-x for x in self.costs(prompt_tokens, candidates)]
        return Choice(argmax_with_tiebreak(scores, candidates), tuple(scores))
