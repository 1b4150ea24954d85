"""One load signal scraped from each engine's Prometheus page, declared once: which gauge the engine exports,
how a page's series combine, where the value lands (the tracker's EngineStats, the policy's Candidate), and how
the sidecar shows it. The table of them is loadaware/load/scraped/__init__.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ScrapedSignal:
    # Its key: a core signal's EngineStats field; any other's key in EngineStats.scraped and Candidate.scraped.
    name: str
    gauge: str  # the engine's metric name, e.g. vllm:num_requests_waiting
    help: str  # the engine's own HELP text (the simulated engines export it with the gauge)
    unit: str = ""  # requests, fraction, seconds, tokens
    # A page's series (one per engine of a multi-engine server) are summed; a fraction is averaged instead.
    average: bool = False
    aliases: tuple[str, ...] = ()  # older names of the gauge, read only when it is absent from the page
    # Reads the value from the whole sample line instead of its number (an info gauge's labels); None: not
    # there. Such a signal is not a plain gauge: the simulated engines do not export it as one.
    read: Callable[[str], float | None] | None = None
    # A core signal has a named EngineStats field (set positionally on the hot path); its Candidate field, if
    # any, is filled by the pipeline by name. Any other signal reaches Candidate.scraped with no edit elsewhere.
    core: bool = False
    candidate: str = ""  # the Candidate field a core signal fills ("": none of its own)
    # The sidecar's per-endpoint gauge of it on /metrics ("": none). A core signal's family is declared in
    # telemetry/metrics.py; any other's is declared from here when the scraper is made.
    metric: str = ""
