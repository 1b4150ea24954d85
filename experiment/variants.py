"""Placement formulas tried for issue 17 and not adopted: experiment arms only, never a sidecar `--policy`.

    python -m experiment.grid --ours predictive-headroom --first-seed 201 --seeds 30 --out out/experiment/grid-headroom
    python -m experiment.placement_probe seeds --point queueing --arms predictive,predictive-headroom

Each is `predictive` (loadaware/policies/predictive.py) with one change; docs/findings.md has what each did on
the grid and why it was not adopted. `arm(name)` resolves these names and everything `experiment.des.arm_by_name`
knows, so the grid and the probe take either.
"""

from __future__ import annotations

from collections.abc import Sequence

from experiment.calibration import CALIBRATED
from experiment.des import Arm, arm_by_name
from loadaware.policies.base import Candidate
from loadaware.policies.predictive import Predictive


class PredictiveClampedCrowd(Predictive):
    """The crowd term's per-sequence price is the engine's learned per_running clamped to [0.5, 2] x the
    prior's (the learned slope is poorly identified: at the reference point identical engines' learned
    per_running moves between 0 and 14-27 ms in one run), and c = 0.15, not 0.1."""

    def __init__(self) -> None:
        super().__init__(crowd=0.15, name="predictive-crowd-clamped")

    def costs(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
        prior = self.prior.per_running_s
        out = super().costs(prompt_tokens, candidates)
        if any(c.waiting > 0 for c in candidates):
            return out  # the saturated formula has no crowd term
        fixed = []
        for x, c in zip(out, candidates):
            learned = prior if c.ttft_per_running_s is None else c.ttft_per_running_s
            clamped = min(max(learned, prior / 2), 2 * prior)
            fixed.append(x + self.crowd * (clamped - learned) * c.load * c.decode_batch)
        return fixed


class PredictiveHeadroom(Predictive):
    """Admission headroom: an engine's own predicted TTFT grows as its batch nears the admission cap, relative
    to the fleet's mean fill, before any engine queues.

        fill(i) = min(load(i) / cap, 0.95), counted only from half full (below: 0)
        own'(i) = own(i) x max(1, (1 - mean fill) / (1 - fill(i)))

    cap: the engines' admission cap (vLLM's --max-num-seqs; the calibrated service model's max_num_seqs here).
    The sidecar does not know it today: adopting this would need it as configuration (or learned from scrapes
    showing waiting > 0, which comes too late: a learned cap did not fix the queueing point). Below half full,
    or when every engine is as full as the mean, it is `predictive` exactly; while any engine queues it is
    `predictive`'s saturated formula."""

    FLOOR = 0.5  # fill below which an engine has headroom enough
    CEILING = 0.95  # keeps 1 - fill away from zero (load counts requests waiting too: fill can pass 1)

    def __init__(self, cap: float = CALIBRATED.max_num_seqs) -> None:
        super().__init__(name="predictive-headroom")
        self.cap = cap

    def fill(self, c: Candidate) -> float:
        f = min(c.load / self.cap, self.CEILING)
        return f if f >= self.FLOOR else 0.0

    def costs(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
        if not candidates or any(c.waiting > 0 for c in candidates):
            return super().costs(prompt_tokens, candidates)
        fills = [self.fill(c) for c in candidates]
        mean = sum(fills) / len(fills)
        out = []
        for c, f in zip(candidates, fills):
            own, stall, crowd = self.terms(prompt_tokens, c)
            out.append(own * max(1.0, (1 - mean) / (1 - f)) + stall + crowd)
        return out


VARIANTS: dict[str, type[Predictive]] = {"predictive-crowd-clamped": PredictiveClampedCrowd,
                                         "predictive-headroom": PredictiveHeadroom}


def arm(name: str) -> Arm:
    """A variant by its name, else `experiment.des.arm_by_name` (every sidecar policy and peer arm)."""
    return Arm(name, name, factory=VARIANTS[name]) if name in VARIANTS else arm_by_name(name)
