"""Predicted-TTFT placement: each endpoint's learned TTFT model prices the request, plus what it costs others.

    cost(i) = own(i) + stall(i) + crowd(i)                                                   lowest wins
    own(i)   = base(i) + lane(i) + per_running(i) x load(i)
    lane(i)  = per_token(i) x (prefill_tokens(i) + uncached(i)) + per_held(i) x (prefill_matched(i) + matched(i))
    stall(i) = a x mine(i) x decode(i),  mine(i) = per_token(i) x uncached(i) + per_held(i) x matched(i)
    crowd(i) = c x per_running(i) x load(i) x decode(i)

When any engine shows an admission queue (scraped waiting > 0: the fleet is at its capacity edge):
    cost(i) = per_token(i) x (prefill_tokens(i) + uncached(i)) x (decode(i) + 1)

uncached(i) = prompt - matched(i); prefill_tokens(i) / prefill_matched(i): the uncached / prefix-held prompt
tokens of the requests routed to i whose first token is not out yet. base, per_token, per_held, per_running
are i's online TTFT model (loadaware.policies.ttft_model), learned from its observed first tokens, so a
slower engine costs more per token, and a "held" token that must still be loaded (from a slower cache tier,
e.g. LMCache's CPU store) costs what the engine shows it costs; before the first observation the prior
stands in. per_held is capped at h x per_token: under load the admission wait correlates with the held
tokens queued (every queued hit carries its whole prefix), and the fit would take that wait for load work.

- own: the request's predicted time to first token on i (the lane's work ahead of it and its own, and the
  decode steps its first token waits for).
- stall: with chunked prefill the request's own prefill shares the engine's steps with its decode batch, so
  it holds up every decoding request there: what leaving a holder costs the others, on top of the miss itself.
- crowd: one more sequence makes every step of the batch longer (per_running per sequence) for each request
  decoding there while it runs: the balance term, which grows with the product of load and batch.
- admission queue: the engine's batch is full and a first token waits for a slot, which the linear model does
  not see; then the fleet has no spare capacity to spend on misses, and the cost is the prefill work ahead
  times the batch it holds up (LMetric's product, in the engine's own seconds per token), which grows as a
  batch nears its cap. Without a fresh scrape waiting is 0 and the first formula stands (fail open).

a, c, h are fixed constants (the same at every operating point), chosen on the placement grid's design
seeds; there is no per-workload tuning, and the per-engine speeds are learned online.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from loadaware.policies.base import Candidate, Choice, Needs, lowest_cost, own_uncached
from loadaware.policies.ttft_model import TtftPrior
from research.candidates import research


@dataclass
class Predictive:
    stall: float = 0.5  # a
    crowd: float = 0.1  # c
    held_cap: float = 0.5  # h: per_held <= h x per_token
    prior: TtftPrior = field(default_factory=TtftPrior)
    name: str = "predictive"
    formula: ClassVar[str] = (
        "cost(i) = base(i) + lane(i) + per_running(i) x load(i) + a x mine(i) x decode(i) + c x per_running(i) "
        "x load(i) x decode(i); lane(i) = per_token(i) x (prefill_tokens(i) + uncached(i)) + per_held(i) x "
        "(prefill_matched(i) + matched(i)); mine(i) = per_token(i) x uncached(i) + per_held(i) x matched(i); "
        "any engine waiting > 0: cost(i) = per_token(i) x (prefill_tokens(i) + uncached(i)) x (decode(i) + 1); "
        "base, per_token, per_held, per_running: i's learned TTFT model; lowest wins")
    # and the TTFT model over every request, which the simulator adds to its candidates (research.candidates)
    needs: ClassVar[Needs] = Needs(signals=True)

    def costs(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
        if any(c.waiting > 0 for c in candidates):
            p = self.prior
            out = []
            for c in map(research, candidates):
                per_token = p.per_token_s if c.ttft_per_token_s is None else c.ttft_per_token_s
                out.append(per_token * (c.prefill_tokens + own_uncached(prompt_tokens, c)) * (c.decode_batch + 1))
            return out
        return [own + stall + crowd for own, stall, crowd in (self.terms(prompt_tokens, c) for c in candidates)]

    def terms(self, prompt_tokens: int, c: Candidate) -> tuple[float, float, float]:
        """(own, stall, crowd) of one candidate: the formula while no engine has an admission queue."""
        p = self.prior
        c = research(c)
        per_token = p.per_token_s if c.ttft_per_token_s is None else c.ttft_per_token_s
        matched = max(0, min(prompt_tokens, c.matched_tokens))
        uncached = prompt_tokens - matched
        base = p.base_s if c.ttft_base_s is None else c.ttft_base_s
        per_running = p.per_running_s if c.ttft_per_running_s is None else c.ttft_per_running_s
        learned_held = p.per_matched_token_s if c.ttft_per_matched_token_s is None else c.ttft_per_matched_token_s
        per_held = min(learned_held, self.held_cap * per_token)
        lane = per_token * (c.prefill_tokens + uncached) + per_held * (c.prefill_matched_tokens + matched)
        mine = per_token * uncached + per_held * matched
        return (base + lane + per_running * c.load, self.stall * mine * c.decode_batch,
                self.crowd * per_running * c.load * c.decode_batch)

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate], mean_load: float | None = None
               ) -> Choice | None:
        return lowest_cost(self.costs(prompt_tokens, candidates), candidates) if candidates else None
