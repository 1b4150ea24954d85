"""The approximate index keeps each engine's recency in runs of a chain (loadaware/prefix/approx.py) and looks up by
bisection: a differential test against the former one-entry-per-block index (tests/unit/approx_reference.py) on
random traffic (shared heads and branches, salts, both bounds, decay, engines dropped): the same keys, the same
answers, the same holders, the same blocks in the same recency order with the same times, the same evictions."""

from __future__ import annotations

import random

import pytest

from loadaware.prefix.approx import ApproxIndex as Index
from tests.unit.approx_reference import ApproxIndex as Reference

ENGINES = ["a", "b", "c", "d"]


def recency(index: Index, engine: str) -> tuple[list[int], list[float]]:
    runs = index._engines[engine].runs
    owner = index._engines[engine].owner
    keys: list[int] = []
    r = runs.next
    while r is not runs:
        keys.extend(reversed(r.keys))
        r = r.next
    return keys, [owner[k].at for k in keys]


def same_state(ref: Reference, new: Index, where: tuple[int, int]) -> None:
    assert ref.total_blocks == new.total_blocks, where
    for engine in ENGINES:
        assert ref.blocks(engine) == new.blocks(engine), where
        held = ref._engines.get(engine)
        if held is not None:
            keys, times = recency(new, engine)
            assert list(held.blocks) == keys, where
            assert [held.blocks[k] for k in keys] == times, where
    assert ref._holders == new._holders, where
    assert ref.evicted == new.evicted, where


def step(rng: random.Random, ref: Reference, new: Index, prompts: list[list[int]], now: float) -> None:
    if rng.random() < 0.5:
        base = rng.choice(prompts)
        prompt = base[:rng.randrange(0, len(base) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 80))]
        prompts.append(prompt)
    else:
        prompt = rng.choice(prompts)
        prompt = prompt[:rng.randrange(0, len(prompt) + 1)] if rng.random() < 0.3 else prompt
    salt = rng.choice([None, None, "s"])
    engine = rng.choice(ENGINES)
    keys = ref.keys(prompt, salt)
    assert keys == new.keys(prompt, salt)
    roll = rng.random()
    if roll < 0.8:
        assert ref.record(engine, keys, now) == new.record(engine, keys, now)
    elif roll < 0.9:
        assert ref.expire(now) == new.expire(now)
    else:
        assert ref.drop(engine) == new.drop(engine)


@pytest.mark.parametrize("seed", range(60))
def test_the_index_in_runs_is_the_index_per_block(seed: int) -> None:
    rng = random.Random(seed)
    cap, max_blocks, ttl = rng.choice([5, 20, 50, 200]), rng.choice([None, 30, 100, 400]), rng.choice([5.0, 50.0])
    ref, new = Reference(cap, 4, ttl, max_blocks), Index(cap, 4, ttl, max_blocks)
    prompts = [[rng.randrange(3) for _ in range(rng.randrange(0, 120))]]
    now = 0.0
    for i in range(300):
        if rng.random() < 0.05:
            now += rng.choice([0.0, 1.0, 10.0])
        step(rng, ref, new, prompts, now)
        for q in rng.sample(prompts, min(5, len(prompts))):
            for salt in (None, "s"):
                keys = ref.keys(q, salt)
                assert ref.match(keys, ENGINES) == new.match(keys, ENGINES), (seed, i)
                assert ref.match(keys, ENGINES[:2]) == new.match(keys, ENGINES[:2]), (seed, i)
        same_state(ref, new, (seed, i))
