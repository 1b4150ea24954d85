"""Round robin over the endpoints in lexical order (stable whatever order discovery reports)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from loadaware.policies.base import Candidate, Choice, Needs
from loadaware.policies.large_pool import LargePool, Selected


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

    def select(self, pool: LargePool) -> Selected | None:
        """Over a large, whole fleet: the endpoint at the turn's place in the lexical order scores 1 and is the
        choice, its fallbacks the least-loaded others (ties: lexical), as over the full pool; nothing else is
        scored. None (a session's endpoint to keep, engines left out, a subset): score the pool as usual."""
        if not pool.whole or pool.keep is not None or not pool.ordered():
            return None
        lexical = pool.lexical()
        pick = lexical[self.turn(len(lexical))]
        chosen = sorted((pick, *pool.least(pool.limit - 1, pick.__eq__)), key=pool.position)
        candidates = tuple(Candidate(ep, 0, pool.load(ep)) for ep in chosen)
        index = chosen.index(pick)
        return candidates, Choice(index, tuple(1.0 if i == index else 0.0 for i in range(len(chosen)))), None

    def turn(self, n: int) -> int:
        """The next turn's position in the lexical order of `n` endpoints."""
        position = self._next % n
        self._next += 1
        return position
