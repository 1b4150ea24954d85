"""One endpoint's prefill clock: when the prefill work routed to it is done, at its learned speed. Pure: the
caller passes the time.

    book:  free_at = max(free_at, now) + price x uncached tokens        at each decision on the endpoint
    wait:  max(free_at - now, 0)                                        what a new request would queue behind

The price per token is the endpoint's idle TTFT model's (ttft ~ base + per_token x uncached + per_running x
load), fitted only on requests decided while the clock was idle and no admission queue was scraped: such a
request's first chunk shows its own prefill and first-token decode steps, with nothing ahead of it. The
model refits (a 4x4 solve) only when `view` is read, so a policy that never reads the clock never pays for it;
until then the clock keeps the price of the last read (the prior's at first).

Every learned price is bounded: within a factor LEARNED_RANGE of the prior's, either way. A fit can only say
what its features explain, and one feature is missing whenever the prefix source credits tokens the engine must
still load (an LMCache CPU hit): their load time is then learned as a larger base and a smaller price per
uncached token, which prices a miss as almost a hit. Bounded, an engine can show itself twice as fast or slow as
the prior (a heterogeneous fleet), and no fit can run away (docs/policies.md).

The signal tracker (signals.py) keeps one per endpoint; the simulator (experiment.des) runs the same tracker.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadaware.policies.ttft_model import TtftModel, TtftPrior

IDLE_S = 1e-3  # a clock this close to now counts as idle
LEARNED_RANGE = 2.0  # a learned price stays within [prior / 2, prior x 2]

_PRIOR = TtftPrior()
_PRIOR_PRICE_S = _PRIOR.per_token_s


def bounded(learned: float, prior: float, factor: float = LEARNED_RANGE) -> float:
    """`learned` clamped to [prior / factor, prior x factor]."""
    lo, hi = prior / factor, prior * factor
    return lo if learned < lo else hi if learned > hi else learned


@dataclass(slots=True)
class PrefillClock:
    free_at: float = 0.0
    # Made at the first lesson (~780 B): an endpoint that never shows a first chunk (BUFFERED mode) keeps none.
    model: TtftModel | None = None
    price_s: float = _PRIOR_PRICE_S  # per uncached token, as of the last view
    # The bounded prices of the last view and the model's observations then: they change only with a lesson,
    # and a decision reads every candidate's.
    _viewed: tuple[int, float, float, float] | None = None

    def idle(self, now: float) -> bool:
        return self.free_at - now < IDLE_S

    def book(self, uncached: int, now: float) -> None:
        start = self.free_at if self.free_at > now else now
        self.free_at = start + self.price_s * uncached

    def learn(self, uncached: int, load: float, ttft_s: float) -> None:
        """A first chunk of a request decided on an idle clock with no admission queue."""
        if self.model is None:
            self.model = TtftModel()
        self.model.observe(uncached, load, ttft_s)

    def lead(self, now: float) -> float:
        """Seconds until the booked prefill work is done (0 when idle)."""
        wait = self.free_at - now
        return wait if wait > 0 else 0.0

    def view(self, now: float) -> tuple[float, float | None, float | None, float | None]:
        """(seconds until idle, then the model's base, per-token and per-running prices, None until learned)."""
        wait = self.lead(now)
        m = self.model
        if m is None or m.observations == 0:
            return wait, None, None, None
        viewed = self._viewed
        if viewed is not None and viewed[0] == m.observations:
            return wait, viewed[1], viewed[2], viewed[3]
        base, per_token, _, per_running = m.prices()
        p = _PRIOR
        base, per_token = bounded(base, p.base_s), bounded(per_token, p.per_token_s)
        per_running = bounded(per_running, p.per_running_s)
        self.price_s = per_token
        self._viewed = (m.observations, base, per_token, per_running)
        return wait, base, per_token, per_running
