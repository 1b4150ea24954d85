"""Every load signal the scraper reads from an engine's page: one line each (docs/architecture.md, "Adding a
scraped signal"). The parser (load/vllm_metrics.py), the tracker's EngineStats, the policy's Candidate
(`scraped_extras`), Explain, /metrics and the simulated engines read this table.

The core signals keep their named fields; any other registered signal lands in `EngineStats.scraped` and,
through `scraped_extras`, in `Candidate.scraped`, keyed by its name. With none registered both stay None and
the decision's hot path pays one check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loadaware.load.scraped.core import KV_CAPACITY, KV_USAGE, RUNNING, TTFT_COUNT, TTFT_SUM, WAITING
from loadaware.load.scraped.spec import ScrapedSignal

if TYPE_CHECKING:
    from loadaware.load.tracker import EngineStats

__all__ = ["SIGNALS", "ScrapedSignal", "Table", "extras_of", "scraped_extras", "table"]

SIGNALS: tuple[ScrapedSignal, ...] = (
    RUNNING,
    WAITING,
    KV_USAGE,
    TTFT_SUM,
    TTFT_COUNT,
    KV_CAPACITY,
)

LEGACY = "_legacy"  # suffix of an alias's key: its sum is used only when the signal's own gauge is absent


@dataclass(frozen=True)
class Table:
    """What the parser and the scraper look up, derived once from SIGNALS."""

    prefixes: tuple[str, ...]  # the metric-name prefixes worth reading a line for ("vllm:")
    wanted: dict[str, str]  # a plain gauge's name (or alias) -> its key (an alias's: name + LEGACY)
    readers: dict[str, ScrapedSignal]  # gauge name -> a signal read from the whole line
    averaged: tuple[str, ...]  # keys averaged over a page's series
    aliased: tuple[str, ...]  # keys with an older name
    extras: tuple[ScrapedSignal, ...]  # the signals beyond the core ones


def _derive(signals: tuple[ScrapedSignal, ...]) -> Table:
    wanted: dict[str, str] = {}
    for s in signals:
        if s.read is None:
            wanted[s.gauge] = s.name
            wanted.update({alias: s.name + LEGACY for alias in s.aliases})
    names = [s.gauge for s in signals] + [a for s in signals for a in s.aliases]
    return Table(tuple(dict.fromkeys(n.split(":", 1)[0] + ":" for n in names)), wanted,
                 {s.gauge: s for s in signals if s.read is not None}, tuple(s.name for s in signals if s.average),
                 tuple(s.name for s in signals if s.aliases), tuple(s for s in signals if not s.core))


_derived: tuple[tuple[ScrapedSignal, ...], Table] | None = None


def table() -> Table:
    """The lookups of the SIGNALS in force (derived again only when the table itself was replaced)."""
    global _derived
    if _derived is None or _derived[0] is not SIGNALS:
        _derived = (SIGNALS, _derive(SIGNALS))
    return _derived[1]


def extras_of(gauges: Mapping[str, float]) -> dict[str, float] | None:
    """A page's values of the signals beyond the core ones, for EngineStats.scraped (None: none registered)."""
    extras = table().extras
    if not extras:
        return None
    return {s.name: gauges[s.name] for s in extras if s.name in gauges}


def scraped_extras(stats: EngineStats | None) -> dict[str, float] | None:
    """What the decision pipeline puts in Candidate.scraped for an endpoint whose fresh stats are `stats`: the
    signals beyond the core ones by name; None without stats or with no such signal registered."""
    return None if stats is None else stats.scraped
