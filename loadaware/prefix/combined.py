"""Several prefix sources at once (`--prefix-source lmcache,kv-events,approx`).

Exact sources (LMCache, KV events) are asked together and each endpoint gets the best of their answers:
LMCache may know chunks offloaded where KV events are not published, KV events know every holder where
LMCache credits one. The approximate source (the sidecar's own record of where it sent each prefix) speaks for
the endpoints that no complete source covers: an engine with neither LMCache nor a KV-event feed, and every
engine that only LMCache covers. LMCache is not complete: it credits each 256-token chunk to the first
registered engine that holds it, so a second engine that holds the prefix (because the sidecar sent it there)
is absent from its answer; there the record adds that holder (the best of the two answers, per endpoint).
KV events name every holder, so where they cover an endpoint a guess never overrides them. One source failing
leaves the others' answers; only when every source fails does the decision fall back to load alone. The
request's cache salt goes to every source; one that cannot tell salts apart (LMCache) declines a salted
request, and the approximate source then speaks for the endpoints it covered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loadaware.prefix.source import PartlyUnavailable, PrefixSource, PrefixUnavailable

Covered = Callable[[Sequence[str]], set[str]]


@dataclass
class Member:
    source: PrefixSource
    covered: Covered  # endpoints this source speaks for
    complete: bool = True  # names every holder of what it credits (KV events); False: one holder per chunk (LMCache)


class CombinedPrefixSource:
    def __init__(self, exact: Sequence[Member], approx: PrefixSource | None = None) -> None:
        if not exact and approx is None:
            raise ValueError("no prefix source to combine")
        self.exact = list(exact)
        self.approx = approx
        self.name = ",".join([m.source.name for m in self.exact] + ([approx.name] if approx else []))

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        answers: list[dict[str, int] | BaseException]
        if len(self.exact) == 1:  # awaited in place: no task to schedule (the default, LMCache with the record)
            try:
                answers = [await self.exact[0].source.matches(tokens, endpoints, salt)]
            except Exception as exc:  # noqa: BLE001 - as gather's return_exceptions: judged below
                answers = [exc]
        else:
            answers = list(await asyncio.gather(*(m.source.matches(tokens, endpoints, salt) for m in self.exact),
                                                return_exceptions=True))
        merged: dict[str, int] = {}
        failure: BaseException | None = None
        covered: set[str] = set()
        for member, answer in zip(self.exact, answers):
            if isinstance(answer, BaseException):
                if not isinstance(answer, PrefixUnavailable):
                    raise answer
                failure = failure or answer
                continue
            if member.complete:
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
        if isinstance(failure, PrefixUnavailable):  # a lost source is named even where the others answered
            raise PartlyUnavailable(failure.reason, merged)
        return merged
