"""The candidates' data: each endpoint as the policy sees it, filled with exactly what the policy declares it
reads (policies/base.py, Needs): its load always; its token signals (load/signals.py) for Needs.signals and for
Explain; the prefix its queued requests hold (prefix/queued.py) for Needs.queued_prefixes; the fleet's working
set (prefix/working_set.py) for Needs.working_set. Each producer that fails leaves its defaults and names itself
in the reasons (loads_error, queued_prefix_error, working_set_error).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from loadaware.load.scraped import scraped_extras
from loadaware.load.signals import SignalTracker
from loadaware.policies import Candidate
from loadaware.prefix.queued import QueuedPrefixes
from loadaware.prefix.working_set import BLOCK_TOKENS, WorkingSet, working_view
from loadaware.routing.context import DecisionContext, degraded


class Loads(Protocol):
    def loads(self, endpoints: tuple[str, ...]) -> list[float]: ...


class CandidateData:
    def __init__(self, loads: Loads, signals: SignalTracker | None = None, working_set: WorkingSet | None = None,
                 queued: QueuedPrefixes | None = None) -> None:
        self.loads = loads
        self.signals = signals  # per-endpoint token signals; None: candidates carry none
        self.working_set = working_set
        self.queued = queued
        self._fleet_capacity = getattr(loads, "kv_capacity_tokens", None)
        self._capacity_seen = 0.0
        self._fresh_stats = getattr(loads, "fresh_stats", None)  # bound once: the candidates are the hot path
        self._correction = getattr(loads, "snapshot_correction", None)

    def plain(self, ctx: DecisionContext, with_signals: bool) -> tuple[Candidate, ...]:
        """Every endpoint of the pool less the excluded, with its load (none known: all idle, and said so); its
        token signals too when `with_signals` (a policy that reads them, never pruned, or Explain)."""
        endpoints = ctx.endpoints
        if ctx.excluded:
            endpoints = tuple(ep for ep in endpoints if ep not in ctx.excluded)
        try:
            loads = self.loads.loads(endpoints)
        except Exception as exc:  # noqa: BLE001 - no load signal: the policy sees every engine idle
            ctx.degrade("loads_error", exc)
            loads = [0.0] * len(endpoints)
        n_tokens, matches = ctx.prompt_tokens, ctx.matches
        if self.signals is not None and with_signals:
            now = self.signals.clock()
            return tuple(self.signalled(ep, min(matches.get(ep, 0), n_tokens), load, now)
                         for ep, load in zip(endpoints, loads))
        return tuple(Candidate(ep, min(matches.get(ep, 0), n_tokens), load) for ep, load in zip(endpoints, loads))

    def signalled(self, ep: str, matched: int, load: float, now: float | None = None) -> Candidate:
        """A candidate with the endpoint's token signals: own counts, the scrape's waiting queue and KV usage
        (when fresh), the decode batch (scraped running plus own decisions since, else own count), the
        endpoint's learned TTFT model, and its prefill clock with the idle model that prices it. `now`: the
        signals' clock, read once per decision by the caller (None: read here)."""
        assert self.signals is not None
        if now is None:
            now = self.signals.clock()
        sig = self.signals.get(ep)
        stats = self._fresh_stats(ep) if self._fresh_stats is not None else None
        if sig is None and stats is None:
            return Candidate(ep, matched, load)
        decoding = float(sig.decoding) if sig is not None else 0.0
        waiting, kv = 0.0, None
        if stats is not None:
            waiting, kv = stats.waiting, stats.kv_usage
            correction = self._correction(ep) if self._correction is not None else 0
            decoding = max(decoding, stats.running + correction)
        if sig is None:
            c = Candidate(ep, matched, load, decode_batch=decoding, waiting=waiting, kv_usage=kv)
        else:
            lane_wait, idle_base, idle_per_token, idle_per_running = sig.prefill_clock.view(now)
            # The one candidate built positionally, in Candidate's field order: it is built once per endpoint per
            # decision, and keywords cost 1.2 µs a candidate against 0.5 (a 1,000-endpoint pool: +0.7 ms).
            # tests/unit/test_load_signals.py pins every field.
            c = Candidate(ep, matched, load, float(sig.prefill_tokens), float(sig.uncached_tokens), decoding, waiting,
                          kv, float(sig.prefill_matched_tokens), lane_wait, idle_base, idle_per_token,
                          idle_per_running)
        if stats is not None and stats.scraped is not None:  # signals beyond the core ones (load/scraped/)
            c.scraped = scraped_extras(stats)
        return c

    def waiting(self, c: Candidate) -> float:
        """The candidate's scraped waiting queue: carried by candidates of a policy with signals, else read from
        the load tracker's fresh stats (0 without a fresh scrape)."""
        if c.waiting > 0 or self._fresh_stats is None:
            return c.waiting
        stats = self._fresh_stats(c.endpoint)
        return stats.waiting if stats is not None else 0.0

    def credit_queued(self, ctx: DecisionContext, candidates: Sequence[Candidate]) -> None:
        """Queueing candidates credited with what the requests queued there hold of the prompt. If that fails
        they keep the exact sources' matches and the decision says so."""
        if self.queued is None or not ctx.tokens:
            return
        try:
            self.queued.credit(tuple(candidates), ctx.tokens, ctx.count)
        except Exception as exc:  # noqa: BLE001 - less credit, the decision goes on
            ctx.degrade("queued_prefix_error", exc)

    def fill_working_set(self, ctx: DecisionContext, candidates: Sequence[Candidate]) -> None:
        """The working set's view on every candidate (working_view)."""
        if ctx.sampled is None or not candidates:
            return
        demand, routes = self.working_view(ctx, candidates)
        for c in candidates:
            c.cache_demand, c.prefix_routes = demand, routes

    def working_view(self, ctx: DecisionContext, candidates: Sequence[Candidate]) -> tuple[float | None, float]:
        """(the fleet's cache demand, the popularity of the prompt's prefix held deepest among `candidates`),
        the working set's capacity first brought up to the fleet's last scraped one. (None, 0): no working set
        or prompt, or it failed (cache demand unknown: the policy reads the fleet as having no room to spare),
        and the decision says so."""
        ws = self.working_set
        if ws is None or ctx.sampled is None:
            return None, 0.0
        try:
            if self._fleet_capacity is not None:
                capacity = self._fleet_capacity()
                if capacity != self._capacity_seen:
                    self._capacity_seen = capacity
                    ws.set_capacity(capacity / BLOCK_TOKENS)
            return working_view(ws, ctx.sampled, max((c.matched_tokens for c in candidates), default=0))
        except Exception as exc:  # noqa: BLE001 - advice lost, the decision goes on without it
            degraded(ctx.reasons, "working_set_error", exc)
            return None, 0.0

    def observe_prompt(self, ctx: DecisionContext) -> None:
        """A counted decision's prompt feeds the working set."""
        ws = self.working_set
        if ctx.sampled and ctx.count and ws is not None:
            try:
                ws.observe(ctx.sampled, ctx.prompt_tokens // BLOCK_TOKENS)
            except Exception as exc:  # noqa: BLE001 - the estimate misses one request, the decision stands
                ctx.degrade("working_set_error", exc)
