"""The decision core decides as the reference did: recorded request streams (every policy in every shipped
configuration, a large fleet, a saturated one: testkit/decision_replay.py) replayed through the current code give
equal decisions, one by one: ranked endpoints, outcome, reasons, rule, affinity, state, pool, and every candidate
with its score (a digest). The reference was recorded before the pipeline became stages (issue 42); re-record
(`python -m testkit.decision_replay --record`) only for a change meant to alter decisions, and say so."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from testkit.decision_replay import config_of, grid, load_group, replay


def first_difference(expected: list[dict[str, Any]], got: list[dict[str, Any]]) -> str:
    for i, (e, g) in enumerate(zip(expected, got)):
        if e != g:
            keys = sorted(k for k in e if e[k] != g.get(k))
            return f"decision {i}: {', '.join(f'{k}: {e[k]!r} -> {g.get(k)!r}' for k in keys)}"
    return f"{len(expected)} decisions recorded, {len(got)} replayed"


@pytest.mark.parametrize("group", sorted(grid()))
def test_replayed_decisions_equal_the_recorded(group: str) -> None:
    streams = load_group(group)
    assert len(streams) == len(grid()[group])
    differing = []
    for stream in streams:
        config = config_of(stream)
        got = asyncio.run(replay(config, stream["events"]))
        if got != stream["decisions"]:
            differing.append(f"{config.name}: {first_difference(stream['decisions'], got)}")
    shown = "\n".join(differing[:10])
    assert not differing, f"{len(differing)} of {len(streams)} streams decide differently:\n{shown}"


def test_the_streams_reach_every_path_the_refactor_moves() -> None:
    """The recording is only as good as what it exercises: pruned and floored pools, all-queueing rules, state,
    affinity moves, failing helpers, the subset hint leaving nobody."""
    seen: set[str] = set()
    for group in grid():
        for stream in load_group(group):
            for d in stream["decisions"]:
                seen.update(f"reason:{r}" for r in d["reasons"])
                seen.add(f"rule:{d['rule']}")
                seen.add(f"affinity:{d['affinity']}")
                seen.add(f"outcome:{d['outcome']}")
                if d["candidates"] < d["pool_size"]:
                    seen.add(f"pruned:{stream['config']['policy']}")
    wanted = {"rule:all_queueing", "rule:state", "affinity:kept", "affinity:moved", "affinity:new",
              "reason:no_tokenizer", "reason:no_prefix_source", "outcome:no_eligible_endpoints",
              "pruned:loadaware", "pruned:lane-spread", "pruned:roundrobin", "pruned:leastload", "pruned:kvaware"}
    assert wanted <= seen, sorted(wanted - seen)
