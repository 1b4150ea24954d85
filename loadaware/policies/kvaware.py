"""The stock KV-aware baseline: longest prefix match wins, load ignored; load-only when nothing matches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from loadaware.policies.base import Candidate, Choice, Needs, argmax_with_tiebreak


@dataclass
class KvAware:
    name: str = "kvaware"
    formula: ClassVar[str] = "score(i) = matched_tokens(i); when nobody matches, score(i) = -load(i)"
    needs: ClassVar[Needs] = Needs(prunable=True)

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate],
               mean_load: float | None = None) -> Choice | None:
        if not candidates:
            return None
        if any(c.matched_tokens > 0 for c in candidates):
            scores = [float(c.matched_tokens) for c in candidates]
        else:
            scores = [-c.load for c in candidates]
        return Choice(argmax_with_tiebreak(scores, candidates), tuple(scores))
