"""docs/architecture.md, "Adding a scraped signal": the worked example, taken from the document as written, is
one module and one table line, and with nothing else an engine's /metrics page is parsed for it, the tracker
keeps it, /metrics and Explain show it, and a decision hands it to the policy on the endpoint's Candidate
(`Candidate.scraped`)."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

import loadaware.load.scraped as scraped
from loadaware.api import explain
from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import RequestLifecycle
from loadaware.load.scraped import ScrapedSignal, scraped_extras
from loadaware.load.scraper import MetricsScraper
from loadaware.load.signals import SignalTracker
from loadaware.load.tracker import LoadTracker
from loadaware.load.vllm_metrics import parse_vllm_gauges
from loadaware.policies import make_policy
from loadaware.routing.builder import build_decider
from loadaware.routing.request import InferenceRequest
from loadaware.telemetry.metrics import Metrics
from sim.metrics import EngineMetrics
from testkit.doc_examples import example_module

ENDPOINT = "127.0.0.2:8000"


def register_the_example(monkeypatch: pytest.MonkeyPatch) -> ScrapedSignal:
    module, table_line = example_module(monkeypatch, "Adding a scraped signal", "loadaware.load.scraped.swapped")
    entry = re.fullmatch(r"\s*(\w+),\s*", table_line)
    assert entry is not None, table_line
    signal = module.__dict__[entry[1]]
    assert isinstance(signal, ScrapedSignal)
    monkeypatch.setattr(scraped, "SIGNALS", (*scraped.SIGNALS, signal))
    return signal


def engine_page(swapped: float) -> str:
    """A simulated engine's page (two engines behind one server: two series each) with the new gauge on it."""
    gauges = {"vllm:num_requests_running": 4.0, "vllm:num_requests_waiting": 1.0, "vllm:kv_cache_usage_perc": 0.5}
    page = EngineMetrics("m", lambda: gauges).render()
    return page + "".join(f'vllm:num_requests_swapped{{engine="{e}",model_name="m"}} {swapped}\n' for e in (0, 1))


def test_the_documented_signal_is_one_module_and_one_table_line(monkeypatch: pytest.MonkeyPatch) -> None:
    assert scraped_extras(None) is None
    plain = parse_vllm_gauges(engine_page(3.0))
    assert "swapped" not in plain  # not registered: not read
    signal = register_the_example(monkeypatch)
    assert parse_vllm_gauges(engine_page(3.0))[signal.name] == 6.0  # summed over the page's series
    assert {k: v for k, v in parse_vllm_gauges(engine_page(3.0)).items() if k != signal.name} == plain

    metrics, loads = Metrics("loadaware"), LoadTracker(stale_s=5)
    scraper = MetricsScraper(EndpointRegistry((ENDPOINT,)), loads, metrics, 1.0, 1.0)
    assert scraper.take(ENDPOINT, engine_page(2.5))
    stats = loads.fresh_stats(ENDPOINT)
    assert stats is not None and stats.scraped == {signal.name: 5.0}
    assert (stats.running, stats.waiting, stats.kv_usage) == (4.0, 1.0, 0.5)  # the core fields as before
    page = metrics.render(loads.snapshot, (ENDPOINT,)).decode()
    assert f'loadaware_engine_swapped{{endpoint="{ENDPOINT}"}} 5.0' in page  # /metrics
    shown = explain.scraped(stats, time.monotonic(), 5.0)  # Explain
    assert shown is not None and shown.signals[signal.name] == 5.0
    # The decision pipeline hands it to a policy that reads the token signals, on the endpoint's candidate:
    decider = build_decider(make_policy("lane-spread"), EndpointRegistry((ENDPOINT,)), loads, RequestLifecycle(),
                            signals=SignalTracker())
    decision = asyncio.run(decider.decide(InferenceRequest("completions", prompt=list(range(64))), "r"))
    assert [c.scraped for c in decision.candidates] == [{signal.name: 5.0}]
    metrics.forget_endpoint(ENDPOINT)  # an endpoint that leaves takes its series along
    assert "loadaware_engine_swapped{" not in metrics.render(loads.snapshot, ()).decode()


def test_without_extra_signals_the_stats_carry_none() -> None:
    loads = LoadTracker(stale_s=5)
    scraper = MetricsScraper(EndpointRegistry((ENDPOINT,)), loads, Metrics("loadaware"), 1.0, 1.0)
    assert scraper.take(ENDPOINT, engine_page(3.0))
    assert scraped_extras(loads.fresh_stats(ENDPOINT)) is None  # the hot path's one check
