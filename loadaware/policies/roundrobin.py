"""Round robin over the endpoints in lexical order (stable whatever order discovery reports)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from loadaware.policies.base import Candidate, Choice, Needs


@dataclass
class RoundRobin:
    name: str = "roundrobin"
    formula: ClassVar[str] = "next endpoint in lexical order; score 1 for it, 0 for the others"
    needs: ClassVar[Needs] = Needs(prefix=False, turns=True)
    _next: int = field(default=0, repr=False)

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate],
               mean_load: float | None = None) -> Choice | None:
        if not candidates:
            return None
        order = sorted(range(len(candidates)), key=lambda i: candidates[i].endpoint)
        pick = order[self.turn(len(order))]
        scores = tuple(1.0 if i == pick else 0.0 for i in range(len(candidates)))
        return Choice(pick, scores)

    def turn(self, n: int) -> int:
        """The next turn's position in the lexical order of `n` endpoints (a large pool's decision picks the
        endpoint at it without scoring the others: routing/pruning.py)."""
        position = self._next % n
        self._next += 1
        return position
