"""Predicted-TTFT placement: each endpoint's learned TTFT model prices the request, plus what it costs others.

    cost(i) = own(i) + stall(i) + spread(i)                                           lowest wins
    own(i)    = base(i) + per_token(i) x ahead(i) + per_running(i) x load(i)
    stall(i)  = per_token(i) x ahead(i) x (a x decode(i) + b x decode(i) / mean_decode)
    spread(i) = c x per_token(i) x prompt_tokens x (load(i) - mean_load) / max(1, mean_load)

ahead(i) = prefill_tokens(i) + uncached(i): the uncached prompt tokens queued for prefill on i (routed, first
token not out yet) plus the request's own (prompt - matched). base, per_token, per_running are i's online
TTFT model (loadaware.policies.ttft_model), learned from its observed first tokens, so a slower engine costs
more per token; before the first observation the prior stands in.

- own: the request's predicted time to first token on i.
- stall: its prefill work, and the work queued ahead of it, holds up the decode batch on i (chunked prefill
  shares the engine's steps); LMetric's (prefill x (decode + 1)) product, in seconds, with the decode batch
  counted both absolutely (a) and relative to the fleet's mean (b, which keeps the term's weight independent of
  fleet size).
- spread: the seed's relative-load term (loadaware.py) priced as a fraction c of a full prefill, so a hot
  prefix is copied to a second engine before its holder queues.

a, b, c are fixed constants (the same at every operating point), chosen on the placement grid's design seeds;
there is no per-workload tuning, and the per-engine speeds are learned online.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from loadaware.policies.base import Candidate, Choice, argmax_with_tiebreak
from loadaware.policies.ttft_model import TtftPrior


@dataclass
class Predictive:
    stall_absolute: float = 0.25  # a
    stall_relative: float = 1.0  # b
    spread: float = 0.25  # c
    prior: TtftPrior = field(default_factory=TtftPrior)
    name: str = "predictive"
    formula: ClassVar[str] = (
        "cost(i) = base(i) + per_token(i) x ahead(i) + per_running(i) x load(i) "
        "+ per_token(i) x ahead(i) x (a x decode(i) + b x decode(i) / mean_decode) "
        "+ c x per_token(i) x prompt x (load(i) - mean_load) / max(1, mean_load); ahead(i) = prefill_tokens(i) + "
        "uncached(i); base, per_token, per_running: i's learned TTFT model; lowest wins")
    uses_prefix: bool = True

    def costs(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
        p = self.prior
        n = len(candidates)
        mean_load = sum(c.load for c in candidates) / n
        load_scale = max(1.0, mean_load)
        mean_decode = max(1.0, sum(c.decode_batch for c in candidates) / n)
        a, b, spread = self.stall_absolute, self.stall_relative, self.spread
        out = []
        for c in candidates:
            base = p.base_s if c.ttft_base_s is None else c.ttft_base_s
            per_token = p.per_token_s if c.ttft_per_token_s is None else c.ttft_per_token_s
            per_running = p.per_running_s if c.ttft_per_running_s is None else c.ttft_per_running_s
            ahead = c.prefill_tokens + max(0, prompt_tokens - c.matched_tokens)
            own = base + per_token * ahead + per_running * c.load
            stall = per_token * ahead * (a * c.decode_batch + b * c.decode_batch / mean_decode)
            spreading = spread * per_token * prompt_tokens * (c.load - mean_load) / load_scale
            out.append(own + stall + spreading)
        return out

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate], mean_load: float | None = None
               ) -> Choice | None:
        if not candidates:
            return None
        scores = [-x for x in self.costs(prompt_tokens, candidates)]
        return Choice(argmax_with_tiebreak(scores, candidates), tuple(scores))
