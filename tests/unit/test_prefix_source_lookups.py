"""Prefix lookups counted per source (prefix/counted.py): answers pass through, each result is counted."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from loadaware.prefix.counted import SourceLookups
from loadaware.prefix.source import PrefixUnavailable
from testkit.metrics_text import metric_sum


class Scripted:
    name = "kv-events"

    def __init__(self, answers: list[dict[str, int] | None]) -> None:
        self.answers = answers

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        answer = self.answers.pop(0)
        if answer is None:
            raise PrefixUnavailable("kv_events_down")
        return answer


def test_each_result_is_counted_and_answers_pass_through() -> None:
    registry = CollectorRegistry()
    counted = SourceLookups(registry).wrap(Scripted([{"a": 32}, {"a": 0}, {}, None]))
    before = generate_latest(registry).decode()
    assert metric_sum(before, "loadaware_prefix_source_lookups_total", {"source": "kv-events", "result": "match"}) == 0
    assert 'result="failed",source="kv-events"' in before  # every child exists from the start, at zero

    async def run() -> list[dict[str, int]]:
        return [await counted.matches([1, 2], ("a",)) for _ in range(3)]

    assert asyncio.run(run()) == [{"a": 32}, {"a": 0}, {}]
    with pytest.raises(PrefixUnavailable):
        asyncio.run(counted.matches([1], ("a",)))
    text = generate_latest(registry).decode()
    counts = {r: metric_sum(text, "loadaware_prefix_source_lookups_total", {"source": "kv-events", "result": r})
              for r in ("match", "empty", "failed")}
    assert counts == {"match": 1, "empty": 2, "failed": 1}
