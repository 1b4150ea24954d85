"""What every routing policy sees and returns. Pure data: no I/O, no clocks."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True)
class Candidate:
    """One endpoint as the policy sees it for one request. Read-only by convention (policies are pure), not
    frozen: a frozen dataclass sets each of these fields through object.__setattr__ in __init__, ~10x the
    cost of plain slots, and a decision builds one candidate per endpoint it scores
    (research/probes/signals_cost.py)."""

    endpoint: str
    matched_tokens: int  # prompt tokens this endpoint already holds (prefix match)
    load: float  # requests in flight on it (own count, refined by scraped metrics)
    # Token-level signals (0 / None when the caller does not track them; the seed's policies ignore them).
    prefill_tokens: float = 0.0  # uncached prompt tokens routed here whose first token has not come yet
    uncached_tokens: float = 0.0  # uncached prompt tokens of every request in flight here (until it ends)
    decode_batch: float = 0.0  # requests in flight here past their first token
    waiting: float = 0.0  # scraped vllm:num_requests_waiting (0 without a fresh scrape)
    kv_usage: float | None = None  # scraped vllm:kv_cache_usage_perc, 0..1
    # Matched (prefix-held) prompt tokens of the requests counted in prefill_tokens: work too whenever a "held"
    # token must still be loaded (e.g. from LMCache's CPU store).
    prefill_matched_tokens: float = 0.0
    # The endpoint's prefill clock (loadaware.load.signals): seconds until the prefill work routed here is done
    # at the endpoint's learned speed; and the TTFT model that speed comes from, fitted only on requests decided
    # while the clock was idle and no admission queue was scraped: ttft ~ base + per_token x uncached prompt +
    # per_running x load. None: not learned (the policy uses its prior).
    lane_wait_s: float = 0.0
    idle_ttft_base_s: float | None = None
    idle_ttft_per_token_s: float | None = None
    idle_ttft_per_running_s: float | None = None
    # The fleet's prefix working set (loadaware.prefix.working_set), the same on every candidate of a decision:
    # its recurring blocks over the fleet's KV capacity (None: unknown, or new prompt heads still arriving),
    # and how often the prompt's held prefix was routed lately. Filled only for a policy that reads them.
    cache_demand: float | None = None
    prefix_routes: float = 0.0
    # Of matched_tokens, those credited because requests routed here while it queued hold them (not yet
    # computed, so no exact source shows them: loadaware.prefix.queued). Filled only for a policy that reads it.
    queued_tokens: float = 0.0
    scraped: dict[str, float] | None = None  # registered scraped signals beyond the above, by name (load/scraped/)


@dataclass(frozen=True, slots=True)
class Choice:
    index: int  # into the candidate sequence
    scores: tuple[float, ...]  # one per candidate, higher is better (for explanations)
    rule: str = ""  # which of the policy's rules chose, for a policy with more than one ("": its usual one)


@dataclass(frozen=True, slots=True)
class Needs:
    """What a policy reads beyond each candidate's matched tokens and load, declared once on the policy: the
    pipeline fills exactly that (each extra costs every decision), and Explain shows it."""

    prefix: bool = True  # the prompt's tokens and prefix matches (False: no tokenization, no lookups)
    signals: bool = False  # the token signals: prefill clock, decode batch, waiting, KV usage (load/signals.py)
    working_set: bool = False  # the fleet's cache demand and the prefix's popularity (prefix/working_set.py)
    queued_prefixes: bool = False  # matches credited from requests queued on an engine (prefix/queued.py)
    # An endpoint that holds nothing of the prompt scores by its load alone, ties to the lower load then the
    # name: a large pool scores only its holders and least-loaded endpoints (routing/pruning.py).
    prunable: bool = False
    # A cost policy whose cost for an endpoint that holds nothing of the prompt has a floor that rises with the
    # endpoint's load (LaneSpread.floor): a large pool scores its holders, then the rest in load order until the
    # floor passes the best costs found (routing/pruning.py, floored_candidates).
    floored: bool = False
    turns: bool = False  # takes turns over the fleet's lexical order (roundrobin's `turn`)


class Policy(Protocol):
    name: str

    @property
    def needs(self) -> Needs:
        """What the pipeline fills for it (Needs)."""
        ...

    @property
    def formula(self) -> str:
        """The scoring rule in words, as Explain shows it."""
        ...

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate],
               mean_load: float | None = None) -> Choice | None:
        """Pick one candidate; None only for an empty fleet. `mean_load`: the pool's mean load when the
        candidates are only part of the pool (routing/pruning.py); None: the candidates are the pool."""
        ...


def argmax_with_tiebreak(scores: Sequence[float], candidates: Sequence[Candidate]) -> int:
    """Highest score; ties go to the longer prefix match (a hit saves compute that a tie says nothing
    about), then the lower load, then the lexically smaller endpoint.

    Deterministic whatever order discovery returned the endpoints in, so two sidecar replicas that see
    the same facts make the same choice. Scores closer than 1e-9 count as equal (float noise).
    """
    best = 0
    for i in range(1, len(scores)):
        diff = scores[i] - scores[best]
        if diff > 1e-9:
            best = i
        elif diff >= -1e-9:
            c, b = candidates[i], candidates[best]
            if (-c.matched_tokens, c.load, c.endpoint) < (-b.matched_tokens, b.load, b.endpoint):
                best = i
    return best


def own_uncached(prompt_tokens: int, c: Candidate) -> int:
    """The request's own prompt tokens that c does not hold (its match clamped to the prompt)."""
    return prompt_tokens - max(0, min(prompt_tokens, c.matched_tokens))


def lowest_cost(costs: Sequence[float], candidates: Sequence[Candidate]) -> Choice:
    """The candidate of lowest cost (a cost policy's choice); its scores are the negated costs, so higher is
    better as for every policy, and ties break as argmax_with_tiebreak says."""
    scores = [-x for x in costs]
    return Choice(argmax_with_tiebreak(scores, candidates), tuple(scores))


def ranked(choice: Choice, candidates: Sequence[Candidate], limit: int) -> tuple[int, ...]:
    """The chosen candidate first, then the next best by score (ties broken as in argmax_with_tiebreak), at
    most `limit` in all: the fallbacks a proxy's retries walk when the chosen engine refuses."""
    if limit <= 1 or len(candidates) <= 1:
        return (choice.index,)
    scores = choice.scores
    rest = heapq.nsmallest(limit - 1, (i for i in range(len(candidates)) if i != choice.index),
                           key=lambda i: (-scores[i], -candidates[i].matched_tokens, candidates[i].load,
                                          candidates[i].endpoint))
    return (choice.index, *rest)
