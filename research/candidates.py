"""Candidates with the TTFT model over every request, which the research arm `predictive` (and its variants)
prices with. The sidecar's pipeline builds plain candidates (`loadaware.policies.base.Candidate`); the
simulator adds these prices for an arm that declares it reads them (`experiment.arms.Reads.ttft_models`: the
arm's registry entry names `with_ttft_models`), so neither the product nor the simulator carries a field only
research reads. A `ResearchCandidate` is also a `experiment.tree_signals.TreeCandidate`, so a test can give one
candidate every signal any arm reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from experiment.tree_signals import TreeCandidate, widen
from loadaware.load.signals import SignalTracker
from loadaware.policies.base import Candidate


@dataclass(slots=True)
class ResearchCandidate(TreeCandidate):
    # The endpoint's TTFT model over every request (loadaware.policies.ttft_model): ttft ~ base + per_token x
    # (prefill_tokens + uncached prompt) + per_matched_token x (prefill_matched_tokens + matched) + per_running
    # x load. None: not learned (the policy uses its prior).
    ttft_base_s: float | None = None
    ttft_per_token_s: float | None = None
    ttft_per_running_s: float | None = None
    ttft_per_matched_token_s: float | None = None


def widened(c: Candidate, **extra: float | None) -> ResearchCandidate:
    """`c` with the research signals in `extra` (the others at their defaults)."""
    return widen(c, ResearchCandidate, **extra)


def research(c: Candidate) -> ResearchCandidate:
    """`c` as an arm that reads research signals sees it: itself when widened, else with none of them."""
    return c if isinstance(c, ResearchCandidate) else widened(c)


def with_ttft_models(candidates: Sequence[Candidate], signals: SignalTracker) -> list[ResearchCandidate]:
    """The candidates with each endpoint's TTFT model prices (the tracker must learn them: ttft_model=True)."""
    out = []
    for c in candidates:
        s = signals.get(c.endpoint)
        m = s.model if s is not None else None
        if m is None or m.observations == 0:
            out.append(widened(c))
            continue
        base, per_token, per_matched, per_running = m.prices()
        out.append(widened(c, ttft_base_s=base, ttft_per_token_s=per_token, ttft_per_running_s=per_running,
                           ttft_per_matched_token_s=per_matched))
    return out
