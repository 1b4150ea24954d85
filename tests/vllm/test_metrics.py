"""The metrics the sidecar scrapes, as this vLLM really exports them: the live page has the captured golden's
shape (every vllm: family with its label names), which the parser's unit test reads
(tests/unit/test_vllm_metrics_golden.py), the load gauges move with real running requests, and KV usage
counts the blocks requests hold, not the prefix cache (what the simulator's sim/held_blocks.py reproduces)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from loadaware.load.vllm_metrics import parse_vllm_gauges
from testkit.vllm import VllmEngine
from tests.conftest import wait_until
from tests.vllm.conftest import Hits, complete, token_prompt

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0-metrics.txt"


def shape(text: str) -> dict[str, set[str]]:
    """vllm: sample name -> its label names (labels whose values vary, e.g. histogram buckets, kept as names)."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:"):
                out.setdefault(sample.name, set()).update(sample.labels)
    return out


def test_live_page_has_the_goldens_shape(pair: tuple[VllmEngine, VllmEngine]) -> None:
    a, b = pair
    golden = shape(GOLDEN.read_text())
    for engine in (a, b):
        live = shape(engine.metrics_text())
        assert live == golden
        page = engine.metrics_text()
        assert f'vllm:num_requests_running{{engine="0",model_name="{engine.served_name}"}}' in page


def test_running_requests_show_in_the_scraped_gauges(pair: tuple[VllmEngine, VllmEngine]) -> None:
    _, b = pair
    stop = threading.Event()

    def long_request(seed: int) -> None:
        # Requests back to back until the check has seen them run: one that ended early (or failed on a loaded
        # machine) is replaced, so the engine keeps three to report.
        while not stop.is_set():
            with contextlib.suppress(Exception):
                b.post("/v1/completions", {"model": b.served_name, "prompt": token_prompt(seed, 50),
                                           "max_tokens": 400, "ignore_eos": True, "temperature": 0})

    workers = [threading.Thread(target=long_request, args=(900 + i,)) for i in range(3)]
    for w in workers:
        w.start()
    try:
        def busy() -> dict[str, float] | None:
            gauges = parse_vllm_gauges(b.metrics_text())
            return gauges if gauges.get("running", 0) >= 2 else None
        assert wait_until(busy, timeout=60, message="vLLM reports the running requests")["kv_usage"] > 0
    finally:
        stop.set()
        for w in workers:
            w.join(120)
    wait_until(lambda: parse_vllm_gauges(b.metrics_text()).get("running") == 0, timeout=60, message="drained")


def test_kv_usage_is_zero_on_an_idle_engine_whose_prefix_stays_cached(pair: tuple[VllmEngine, VllmEngine]) -> None:
    """vLLM's kv_cache_usage_perc counts blocks some request references: a finished request's blocks stay
    cached (the next request hits them) but are free, so an idle warm engine reports 0, not a full cache."""
    a, _ = pair
    prompt = token_prompt(4242, 8 * a.block_size)

    def idle() -> bool:
        gauges = parse_vllm_gauges(a.metrics_text())
        return gauges.get("running") == 0 and gauges.get("kv_usage") == 0.0

    complete(a, prompt)
    wait_until(idle, timeout=60, message="the finished request's blocks are free")
    hits = Hits(a)
    complete(a, prompt)
    assert hits.delta(len(prompt)) == 7 * a.block_size  # still cached: every block but the last token's
    wait_until(idle, timeout=60, message="free again")


def test_the_scraped_kv_capacity_is_the_engines_block_count_times_its_block_size(
        pair: tuple[VllmEngine, VllmEngine]) -> None:
    """What lane-spread measures the fleet's working set against (loadaware/prefix/working_set.py)."""
    for engine in pair:
        page = engine.metrics_text()
        info = [s.labels for f in text_string_to_metric_families(page) for s in f.samples
                if s.name == "vllm:cache_config_info"]
        assert len(info) == 1 and info[0]["block_size"] == str(engine.block_size)
        blocks = int(info[0]["num_gpu_blocks"])
        assert blocks > 0
        assert parse_vllm_gauges(page)["kv_capacity_tokens"] == blocks * engine.block_size
