"""`banded`: lane-spread's choice, only ever among the engines the seed's `loadaware` ranks near its own choice.

    la(i)   = min(1, matched(i) / prompt) - (load(i) - mean_load) / max(1, mean_load)     loadaware, beta 1
    band    = { i : la(i) >= max_j la(j) - BAND }                                            BAND = 0.25
    choice  = the lowest lane-spread cost(i) over the band       (loadaware/policies/lane_spread.py)

The guarantee, which holds whatever the prices, signals or prefix source say: the engine chosen scores at most
BAND below `loadaware`'s own choice by `loadaware`'s own score over the same candidates. One unit of that score
is a whole prompt's prefix or one mean load (of at least one request), so the choice is never an engine that
`loadaware` sees as more than a quarter of a mean load busier than its own for the same prefix, nor one that
holds a quarter of the prompt less at the same load. `loadaware`'s choice is always in the band, so at BAND 0
this is `loadaware` (ties aside). The fallbacks rank the band first, then the rest by the same cost.

Why: lane-spread prices each engine's first token from a prefill clock and learned speeds, which wins where its
inputs are right; where they are not (stock LMCache credits one holder per chunk, a response path that shows no
first tokens, a cold start, text units without a tokenizer), a price can send a hot prefix to one engine far
past the point where `loadaware`'s load term turns it away. The band keeps lane-spread's judgement for the
choices loadaware considers nearly equal, which is where a first-token model has something to add (a faster
engine at the same load, a holder a little busier than a non-holder, one of several idle engines), and leaves
the others to loadaware's balance. lane-spread's pile-up guard is not applied: the band bounds pile-ups as
loadaware's load term does. While every candidate queues, lane-spread itself chooses as loadaware.

BAND was chosen once on the scenario generator's design draws (experiment.scenarios), from 0, 0.1, 0.25 and
0.5; the held-out draws' figures are in docs/results.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from loadaware.policies.base import Candidate, Choice, Needs, argmax_with_tiebreak
from loadaware.policies.bounded import PRICED_OUT
from loadaware.policies.lane_spread import LaneSpread
from loadaware.policies.loadaware import loadaware_scores

BAND = 0.25
OUT_OF_BAND = "out_of_band"  # not a rule that chooses: the explanation's word for an engine outside the band


def in_band(scores: Sequence[float], band: float) -> list[bool]:
    """Which of loadaware's `scores` are within `band` of the best (float noise counted as equal)."""
    best = max(scores)
    return [s >= best - band - 1e-9 for s in scores]


@dataclass
class Banded:
    band: float = BAND
    inner: LaneSpread = field(default_factory=lambda: LaneSpread(max_share=1.0))
    name: str = "banded"
    formula: ClassVar[str] = (
        f"lane-spread's lowest cost among the endpoints whose loadaware score (beta 1: min(1, matched / prompt) - "
        f"(load - mean_load) / max(1, mean_load)) is within {BAND:g} of the best loadaware score")
    # Pruned over a large pool as loadaware is (its holders and least loaded, each with its token signals):
    # loadaware's own choice is always among them, so the guarantee holds there too.
    needs: ClassVar[Needs] = Needs(signals=True, working_set=True, queued_prefixes=True, prunable=True)

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate], mean_load: float | None = None
               ) -> Choice | None:
        if not candidates:
            return None
        inner = self.inner.choose(prompt_tokens, candidates, mean_load)
        assert inner is not None  # it has candidates
        keep = in_band(loadaware_scores(prompt_tokens, candidates, 1.0, mean_load), self.band)
        scores = tuple(s if k else s - PRICED_OUT for s, k in zip(inner.scores, keep))
        return Choice(argmax_with_tiebreak(scores, candidates), scores, inner.rule)
