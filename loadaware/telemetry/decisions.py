"""What the request lifecycle tells telemetry: decision metrics, the decision log, the recent-decisions ring.

Each is a lifecycle listener (loadaware/lifecycle.py); the pipeline emits `decided` and knows none of them.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from loadaware.lifecycle import Decision
from loadaware.policies import Choice, ranked
from loadaware.telemetry.metrics import Metrics

log = logging.getLogger("loadaware.routing")

# A dead helper turns every decision into a fallback: one warning per reason per second is enough.
FALLBACK_LOG_INTERVAL_S = 1.0


class DecisionMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def on_decided(self, decision: Decision) -> None:
        m = self.metrics
        m.decided(decision.endpoint or "none", decision.outcome)
        for reason in decision.reasons:
            m.fallback(reason)
        m.decision_seconds.observe(decision.total_s)
        if decision.state:
            m.state_placements.labels(decision.state).inc()
        for stage, seconds in decision.stages.items():
            m.stage(stage, seconds)

    def on_served(self, decision: Decision, previous: str | None) -> None:
        pass

    def on_ended(self, decision: Decision) -> None:
        pass

    def on_responded(self, decision: Decision, status: int) -> None:
        self.metrics.responded(decision.served or "none", status)


class DecisionLog:
    """Every decision at DEBUG; fallbacks at WARNING, rate-limited per reason."""

    def __init__(self) -> None:
        self._last_fallback_log: dict[str, float] = {}

    def on_decided(self, d: Decision) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request_id=%s endpoint=%s outcome=%s reasons=%s tokens=%d scores=%s", d.request_id,
                      d.endpoint, d.outcome, ",".join(d.reasons) or "-", d.prompt_tokens,
                      ",".join(f"{c.endpoint}:{c.matched_tokens}/{c.load:g}={s:.3f}"
                               for c, s in zip(d.candidates, d.scores)))
        elif d.reasons and d.reasons != ("no_prompt",):
            now = time.monotonic()
            key = ",".join(d.reasons)
            if now - self._last_fallback_log.get(key, 0.0) >= FALLBACK_LOG_INTERVAL_S:
                self._last_fallback_log[key] = now
                log.warning("request_id=%s endpoint=%s fell back to load only: %s", d.request_id, d.endpoint, key)

    def on_served(self, d: Decision, previous: str | None) -> None:
        log.info("request_id=%s chosen=%s served by %s", d.request_id, previous, d.served)

    def on_ended(self, decision: Decision) -> None:
        pass


# Candidates a recorded decision keeps: its ranked head (the choice and its fallbacks come first in it).
RING_CANDIDATES = 16


class RecentDecisions:
    """The last N decisions for /debug/decisions (bounded; rendered without prompt tokens). Each keeps only
    its ranked head of candidates: at 10,000 endpoints 256 full candidate lists would be ~250 MB, and the
    page could not be rendered in reasonable time."""

    def __init__(self, size: int = 256) -> None:
        self.items: deque[Decision] = deque(maxlen=size)

    def on_decided(self, decision: Decision) -> None:
        # The ring is the last listener (app.py): nobody reads the full candidate list after it.
        if len(decision.candidates) > RING_CANDIDATES and decision.endpoint is not None:
            keep = ranked_head(decision)
            decision.candidates = tuple(decision.candidates[i] for i in keep)
            decision.scores = tuple(decision.scores[i] for i in keep)
        self.items.append(decision)

    def on_served(self, decision: Decision, previous: str | None) -> None:
        pass

    def on_ended(self, decision: Decision) -> None:
        pass

    def last(self, n: int) -> list[Decision]:
        return list(self.items)[-n:] if n > 0 else []


def ranked_head(decision: Decision) -> tuple[int, ...]:
    """Indexes of RING_CANDIDATES candidates: the decision's ranked list (the choice and its fallbacks),
    then the next best, ranked as the policies rank them."""
    where = {c.endpoint: i for i, c in enumerate(decision.candidates)}
    head = [where[ep] for ep in decision.ranked if ep in where]
    taken = set(head)
    best = ranked(Choice(head[0] if head else 0, decision.scores), decision.candidates, RING_CANDIDATES + len(head))
    head += [i for i in best if i not in taken][:RING_CANDIDATES - len(head)]
    return tuple(head)
