"""The simulated engine's KV usage is vLLM's: blocks in-flight requests hold, shared ones once, idle cache not."""

from __future__ import annotations

import pytest

from sim.engine_core import EngineCore
from sim.held_blocks import HeldBlocks, private_blocks
from sim.service_model import ServiceModel

USAGE = "vllm:kv_cache_usage_perc"


def test_shared_blocks_count_once_and_released_blocks_are_free() -> None:
    held = HeldBlocks()
    held.hold([1, 2, 3])
    held.hold([1, 2, 4])
    held.private += 2
    assert len(held) == 4 + 2 and held.usage(12) == pytest.approx(0.5)
    held.release([1, 2, 3])
    held.private -= 1
    assert len(held) == 3 + 1
    held.release([1, 2, 4])
    held.private -= 1
    assert len(held) == 0 and held.usage(12) == 0.0
    held.hold(range(20))
    assert held.usage(10) == 1.0  # clamped, as a ratio of the pool


@pytest.mark.parametrize(("prompt", "produced", "blocks"), [(32, 0, 0), (40, 0, 1), (40, 8, 1), (40, 9, 2),
                                                              (32, 1, 1), (32, 17, 2)])
def test_private_blocks_are_the_partial_prompt_block_with_the_output(prompt: int, produced: int,
                                                                     blocks: int) -> None:
    assert private_blocks(prompt, produced, 16) == blocks


async def test_the_engine_reports_what_its_requests_hold_and_not_its_idle_cache() -> None:
    service = ServiceModel(prefill_tokens_per_s=1e9, prefill_overhead_ms=0, decode_base_ms=0,
                           decode_per_seq_ms=0, kv_capacity_tokens=16 * 100)
    core = EngineCore("engine-0", "m", service, ["x"])
    prompt = list(range(1000, 1040))  # 2 full blocks + an 8-token partial one
    a = core.generate(prompt, max_tokens=20)
    b = core.generate(prompt, max_tokens=20)
    await anext(a)
    await anext(b)
    # 2 shared prompt blocks once, and each request's partial block holding its first output token.
    assert core.gauges()[USAGE] == pytest.approx((2 + 1 + 1) / 100)
    for _ in range(8):  # a's partial block fills up (8 prompt + 8 output tokens), its 9th token opens a block
        await anext(a)
    assert core.gauges()[USAGE] == pytest.approx((2 + 2 + 1) / 100)
    await a.aclose()
    assert core.gauges()[USAGE] == pytest.approx((2 + 1) / 100)
    await b.aclose()
    assert core.gauges()[USAGE] == 0.0
    assert core.state()["cached_blocks"] == 2  # still cached (a hit for the next request), but free
