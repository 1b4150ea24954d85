"""Scheduler slots (FIFO, no leaks on cancellation) and the Prometheus text of the engine metrics."""

import asyncio

from sim.metrics import EngineMetrics
from sim.scheduler import Scheduler
from tests.conftest import wait_until_async


async def test_scheduler_queues_beyond_max_and_hands_slots_over_fifo() -> None:
    s = Scheduler(max_num_seqs=1)
    order: list[int] = []
    finish = asyncio.Event()  # each job holds its slot until the test lets them all finish

    async def job(i: int) -> None:
        async with s.slot():
            order.append(i)
            await finish.wait()

    tasks = [asyncio.create_task(job(i)) for i in range(3)]
    await wait_until_async(lambda: s.running + s.waiting == 3, message="all three jobs at the scheduler")
    assert (s.running, s.waiting) == (1, 2)
    finish.set()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2] and (s.running, s.waiting) == (0, 0)


async def test_cancelled_waiter_and_cancelled_runner_leak_nothing() -> None:
    s = Scheduler(max_num_seqs=1)
    hold = asyncio.Event()

    async def job() -> None:
        async with s.slot():
            await hold.wait()

    runner = asyncio.create_task(job())
    waiter = asyncio.create_task(job())
    await wait_until_async(lambda: (s.running, s.waiting) == (1, 1), message="one job running, one waiting")
    waiter.cancel()
    runner.cancel()
    await asyncio.gather(runner, waiter, return_exceptions=True)
    assert (s.running, s.waiting) == (0, 0)


def test_metrics_text_has_vllm_names_and_labels() -> None:
    m = EngineMetrics("tiny-model", lambda: {"vllm:num_requests_running": 3, "vllm:num_requests_waiting": 1,
                                            "vllm:kv_cache_usage_perc": 0.25})
    m.prompt_tokens = 1600
    m.ttft.observe(0.015)
    text = m.render()
    lb = 'engine="0",model_name="tiny-model"'
    assert f"vllm:num_requests_running{{{lb}}} 3.0" in text
    assert f"vllm:num_requests_waiting{{{lb}}} 1.0" in text
    assert f"vllm:kv_cache_usage_perc{{{lb}}} 0.25" in text
    assert f"vllm:prompt_tokens_total{{{lb}}} 1600.0" in text
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:generation_tokens_total",
                 "vllm:request_success_total", "vllm:num_preemptions_total"):
        assert f"# TYPE {name} counter" in text
    assert f'vllm:time_to_first_token_seconds_bucket{{{lb},le="0.01"}} 0.0' in text
    assert f'vllm:time_to_first_token_seconds_bucket{{{lb},le="0.02"}} 1.0' in text
    assert f"vllm:time_to_first_token_seconds_count{{{lb}}} 1.0" in text
    assert "# TYPE vllm:e2e_request_latency_seconds histogram" in text
    # A real Prometheus parser accepts it and sees every family.
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["vllm:time_to_first_token_seconds"].type == "histogram"
    assert families["vllm:prompt_tokens"].type == "counter"
    assert families["vllm:kv_cache_usage_perc"].samples[0].labels == {"engine": "0", "model_name": "tiny-model"}


async def test_waiter_cancelled_in_the_same_tick_as_a_release() -> None:
    s = Scheduler(max_num_seqs=1)
    hold = asyncio.Event()

    async def job() -> None:
        async with s.slot():
            await hold.wait()

    # One loop turn each (not a wait for time): the runner takes the slot, then the waiter queues.
    runner = asyncio.create_task(job())
    await asyncio.sleep(0)
    assert (s.running, s.waiting) == (1, 0)
    waiter = asyncio.create_task(job())
    await asyncio.sleep(0)
    assert (s.running, s.waiting) == (1, 1)
    # The runner wakes first and its release() pops the waiter's already-cancelled future.
    runner.cancel()
    waiter.cancel()
    results = await asyncio.gather(runner, waiter, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert (s.running, s.waiting) == (0, 0)
