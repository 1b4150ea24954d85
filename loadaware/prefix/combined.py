"""Several prefix sources at once (`--prefix-source lmcache,kv-events,approx`).

Exact sources (LMCache, KV events) are asked together and each endpoint gets the best of their answers:
LMCache may know chunks offloaded where KV events are not published, KV events know every holder where
LMCache credits one. The approximate source only speaks for endpoints that no exact source covers (an
engine with neither LMCache nor a KV-event feed): a guess never overrides a fact. One source failing
leaves the others' answers; only when every source fails does the decision fall back to load alone. The
request's cache salt goes to every source; one that cannot tell salts apart (LMCache) declines a salted
request, and the approximate source then speaks for the endpoints it covered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loadaware.prefix.source import PrefixSource, PrefixUnavailable

Covered = Callable[[Sequence[str]], set[str]]


@dataclass
class Member:
    source: PrefixSource
    covered: Covered  # endpoints this source speaks for


class CombinedPrefixSource:
    def __init__(self, exact: Sequence[Member], approx: PrefixSource | None = None) -> None:
        if not exact and approx is None:
            raise ValueError("no prefix source to combine")
        self.exact = list(exact)
        self.approx = approx
        self.name = ",".join([m.source.name for m in self.exact] + ([approx.name] if approx else []))

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        answers = await asyncio.gather(*(m.source.matches(tokens, endpoints, salt) for m in self.exact),
                                       return_exceptions=True)
        merged: dict[str, int] = {}
        failure: BaseException | None = None
        covered: set[str] = set()
        for member, answer in zip(self.exact, answers):
            if isinstance(answer, BaseException):
                if not isinstance(answer, PrefixUnavailable):
                    raise answer
                failure = failure or answer
                continue
            covered |= member.covered(endpoints)
            for endpoint, matched in answer.items():
                if matched > merged.get(endpoint, 0):
                    merged[endpoint] = matched
        all_failed = failure is not None and all(isinstance(a, BaseException) for a in answers)
        if self.approx is not None:
            # With every exact source down, the guess speaks for every endpoint: better than nothing.
            rest = tuple(ep for ep in endpoints if ep not in covered)
            if rest:
                for endpoint, matched in (await self.approx.matches(tokens, rest, salt)).items():
                    merged[endpoint] = max(matched, merged.get(endpoint, 0))
        elif all_failed:
            assert failure is not None
            raise failure
        return merged
