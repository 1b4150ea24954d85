"""Placement formulas tried for issue 17 and not adopted: experiment arms only, never a sidecar `--policy`.

    python -m experiment.grid --ours predictive-headroom --first-seed 201 --seeds 30 --out out/experiment/grid-headroom
    python -m experiment.grid --credit gpu --ours lane --arms lane-product,lane-greedy --out out/experiment/g
    python -m experiment.placement_probe seeds --point queueing --arms predictive,predictive-headroom

The `predictive-*` arms are `predictive` (loadaware/policies/predictive.py) with one change. The `lane-*` arms
are the sidecar's `lane` policy (loadaware/policies/lane.py) at the engines' known speeds instead of learned
ones: `lane-product` exactly so, `lane-greedy` without the decode factor (a design bound: the sidecar is not
told the speeds). docs/findings.md has what each did on the grid and why
it was not adopted. `arm(name)` resolves these names and everything `experiment.des.arm_by_name` knows, so the
grid and the probe take either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from experiment.calibration import CALIBRATED
from experiment.des import Arm, arm_by_name
from loadaware.policies.base import Candidate, Choice, Policy, lowest_cost, own_uncached
from loadaware.policies.lane import DECODE_EXPONENT
from loadaware.policies.predictive import Predictive
from sim.service_model import ServiceModel

if TYPE_CHECKING:
    from experiment.des import Simulation


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


class LaneTtft:
    """Predicted TTFT from a prefill clock, at the engines' known speeds, times the decode batch's weight.

        ttft(i) = max(free(i) - now, 0) + prefill_seconds_i(uncached(i)) + first_token_seconds_i(load(i) + 1)
        cost(i) = ttft(i) x (decode(i) + 1) ^ k                                               lowest wins
        after the decision: free(j) = max(free(j), now) + prefill_seconds_j(uncached(j)) for the chosen j

    free(i) is when the prefill work this router sent to engine i ends, by a clock it keeps itself (a virtual
    FIFO lane that drains while time passes, where `predictive`'s lane counts every routed token until its
    first token is seen); prefill_seconds and first_token_seconds are the engine's own service model
    (`sim.service_model`), which the simulation hands over (`bind_simulation`): the speeds are known here,
    learned in the sidecar. k = 0 is the greedy predicted-TTFT choice; `lane`'s k (0.75) weighs a long decode
    batch (LMetric's (decode + 1) factor, at that power), which keeps a holder from filling to its admission
    cap. Both add `lane`'s saturation term, own prefill x the engine's admission queue. A DES arm only: it
    needs the simulation's clock and engines, and `choose` advances the clock, so it
    must be called once per routed request (the simulator does)."""

    def __init__(self, exponent: float, name: str) -> None:
        self.uses_prefix = True
        self.uses_signals = True
        self.exponent = exponent
        self.name = name
        self.formula = ("cost(i) = (lane wait(i) + own prefill(i) + first-token steps(i)) x (decode(i) + 1)^"
                        f"{exponent:g} + own prefill(i) x waiting(i); known engine speeds; lowest wins")
        self._now: Callable[[], float] = lambda: 0.0
        self._service: dict[str, ServiceModel] = {}
        self._free: dict[str, float] = {}

    def bind_simulation(self, sim: Simulation) -> None:
        self._now = lambda: sim.now
        self._service = {e.name: e.svc for e in sim.engines}

    def prefill_s(self, endpoint: str, uncached: int) -> float:
        """The engine's prefill time for `uncached` computed tokens (what the clock advances by)."""
        return self._service.get(endpoint, CALIBRATED).prefill_seconds(uncached)

    def first_token_s(self, endpoint: str, load: float) -> float:
        """From the end of the prefill to the first token, with `load` requests on the engine."""
        return self._service.get(endpoint, CALIBRATED).first_token_seconds(int(load) + 1)

    def wait_s(self, endpoint: str, now: float) -> float:
        return max(self._free.get(endpoint, 0.0) - now, 0.0)

    def ttft(self, prompt_tokens: int, c: Candidate, now: float) -> float:
        uncached = own_uncached(prompt_tokens, c)
        return self.wait_s(c.endpoint, now) + self.prefill_s(c.endpoint, uncached) + self.first_token_s(c.endpoint,
                                                                                                        c.load)

    def costs(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
        now = self._now()
        return [self.ttft(prompt_tokens, c, now) * (c.decode_batch + 1) ** self.exponent
                + self.prefill_s(c.endpoint, own_uncached(prompt_tokens, c)) * c.waiting
                for c in candidates]

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate], mean_load: float | None = None
               ) -> Choice | None:
        if not candidates:
            return None
        choice = lowest_cost(self.costs(prompt_tokens, candidates), candidates)
        c, now = candidates[choice.index], self._now()
        uncached = own_uncached(prompt_tokens, c)
        self.decided(c, uncached, now)
        self._free[c.endpoint] = max(self._free.get(c.endpoint, 0.0), now) + self.prefill_s(c.endpoint, uncached)
        return choice

    def decided(self, c: Candidate, uncached: int, now: float) -> None:
        """Called with each choice before the clock advances (a learning subclass remembers it)."""


class LaneGreedy(LaneTtft):
    """k = 0: the engine with the lowest predicted TTFT (the clairvoyant-speed greedy choice)."""

    def __init__(self) -> None:
        super().__init__(0.0, "lane-greedy")


class LaneProduct(LaneTtft):
    """k = `lane`'s decode exponent."""

    def __init__(self) -> None:
        super().__init__(DECODE_EXPONENT, "lane-product")


# Classes, not closures: the grid pickles arms into its worker processes.
VARIANTS: dict[str, Callable[[], Policy]] = {
    "predictive-crowd-clamped": PredictiveClampedCrowd,
    "predictive-headroom": PredictiveHeadroom,
    "lane-greedy": LaneGreedy,
    "lane-product": LaneProduct,
}


def arm(name: str) -> Arm:
    """A variant by its name, else `experiment.des.arm_by_name` (every sidecar policy and peer arm)."""
    return Arm(name, name, factory=VARIANTS[name]) if name in VARIANTS else arm_by_name(name)
