"""Pure least-load: the endpoint with the fewest requests in flight."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from loadaware.policies.base import Candidate, Choice, Needs, argmax_with_tiebreak


@dataclass
class LeastLoad:
    name: str = "leastload"
    formula: ClassVar[str] = "score(i) = -load(i)"
    needs: ClassVar[Needs] = Needs(prefix=False, prunable=True)

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate],
               mean_load: float | None = None) -> Choice | None:
        if not candidates:
            return None
        scores = [-c.load for c in candidates]
        return Choice(argmax_with_tiebreak(scores, candidates), tuple(scores))
