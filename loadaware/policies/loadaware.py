"""The product's policy: cache locality traded against fleet-relative load.

    score(i)         = min(1, matched_tokens(i) / prompt_tokens) - beta * relative_load(i)
    relative_load(i) = (load(i) - mean_load) / max(1, mean_load)

Both terms are dimensionless, so the choice is invariant to prompt length and to scaling every load
(above the near-idle clamp). beta is the exchange rate: how much prefix benefit one mean-load of excess
load is worth. beta = 0 is pure cache affinity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from loadaware.policies.base import Candidate, Choice, Needs, argmax_with_tiebreak


def benefit(matched_tokens: int, prompt_tokens: int) -> float:
    if prompt_tokens <= 0 or matched_tokens <= 0:
        return 0.0
    return min(1.0, matched_tokens / prompt_tokens)


def mean_load(loads: Sequence[float]) -> float:
    return sum(loads) / len(loads) if loads else 0.0


def relative_loads(loads: Sequence[float], mean: float | None = None) -> list[float]:
    """`mean`: the pool's mean load when `loads` are only part of the pool; None: their own mean."""
    mean = mean_load(loads) if mean is None else mean
    # The clamp keeps a near-idle fleet (mean < 1) from turning one extra request into a huge penalty.
    scale = max(1.0, mean)
    return [(load - mean) / scale for load in loads]


def loadaware_scores(prompt_tokens: int, candidates: Sequence[Candidate], beta: float,
                     mean: float | None = None) -> list[float]:
    rel = relative_loads([c.load for c in candidates], mean)
    return [benefit(c.matched_tokens, prompt_tokens) - beta * r for c, r in zip(candidates, rel)]


@dataclass
class LoadAware:
    beta: float = 1.0
    name: str = "loadaware"
    formula: ClassVar[str] = ("score(i) = min(1, matched_tokens(i) / prompt_tokens) - beta * relative_load(i); "
                              "relative_load(i) = (load(i) - mean_load) / max(1, mean_load)")
    needs: ClassVar[Needs] = Needs(prunable=True)

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate],
               mean_load: float | None = None) -> Choice | None:
        if not candidates:
            return None
        scores = loadaware_scores(prompt_tokens, candidates, self.beta, mean_load)
        return Choice(argmax_with_tiebreak(scores, candidates), tuple(scores))
