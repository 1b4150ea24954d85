"""Predicted TTFT from a prefill clock, weighed by the decode batch it would join.

    ttft(i) = lane_wait(i) + per_token(i) x uncached(i) + base(i) + per_running(i) x load(i)
    cost(i) = ttft(i) x (decode(i) + 1) ^ 0.75 + per_token(i) x uncached(i) x waiting(i)       lowest wins

lane_wait(i): seconds until the prefill work this router sent to i is done, by a clock the sidecar keeps per
endpoint (loadaware.load.signals): each decision on i moves it to max(clock, now) + per_token(i) x the request's
uncached tokens, and it drains as time passes. base, per_token, per_running: i's TTFT model fitted only on
requests decided while i's clock was idle and no admission queue was scraped, so each of those first chunks
shows a request's own prefill and first-token decode steps with nothing ahead of it (the prior stands in
until the first one; without a response path, e.g. Envoy's BUFFERED mode, it stays the prior). uncached(i) =
prompt - matched(i). waiting(i): the endpoint's admission queue as last scraped (vllm:num_requests_waiting; 0
without a fresh scrape).

- The clock is the difference from `predictive`: predictive prices every routed token until that request's
  first token, including work the engine has already done, and fits its per-token price against that count.
- (decode + 1) ^ 0.75: LMetric's decode factor (arXiv 2603.15202) at the power 3/4. Without it the choice is
  greedy on predicted TTFT, which fills a prefix holder to its admission cap (a hit there stays the cheapest
  first token until the holder queues). The power was chosen once, on grid seeds 201-220 that neither the
  design (1-10) nor the held-out test (101-120) uses, from 0.5, 0.625, 0.75, 0.875 and 1: lower powers keep
  hot prefixes on too few engines (long-prefix and queueing lose to `lmetric`), higher ones pay misses the
  batch does not repay (low-sharing and multi-turn lose) (research/notebook.md).

- per_token x uncached x waiting: what the request's own prefill costs the others on a saturated engine. There
  the admission queue is about as long behind a request as ahead of it, so the prefill a miss adds delays about
  waiting(i) later requests by its own length. On an engine with free slots (waiting 0) the term is 0; while
  the fleet is saturated it keeps prefixes where they are cached, which is what a saturated fleet's throughput
  (and so its queue) depends on; what it changed on the placement grid is in research/notebook.md.

No per-workload constant: the exponent is fixed, the speeds are learned per endpoint. How it fares on the
placement grid (experiment.grid, `--credit gpu`): research/notebook.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from loadaware.policies.base import Candidate, Choice, Needs, lowest_cost, own_uncached
from loadaware.policies.ttft_model import TtftPrior

DECODE_EXPONENT = 0.75


@dataclass
class Lane:
    prior: TtftPrior = field(default_factory=TtftPrior)
    name: str = "lane"
    formula: ClassVar[str] = (
        "cost(i) = (lane_wait(i) + per_token(i) x uncached(i) + base(i) + per_running(i) x load(i)) x "
        f"(decode(i) + 1)^{DECODE_EXPONENT:g} + per_token(i) x uncached(i) x waiting(i); lane_wait: the "
        "endpoint's prefill clock; base, per_token, per_running: its TTFT model learned from requests decided on "
        "an idle clock; waiting: its scraped admission queue; lowest wins")
    needs: ClassVar[Needs] = Needs(signals=True)

    def own_prefill_s(self, prompt_tokens: int, c: Candidate) -> float:
        """The request's own prefill on c: its uncached tokens at c's learned price."""
        per_token = self.prior.per_token_s if c.idle_ttft_per_token_s is None else c.idle_ttft_per_token_s
        return per_token * own_uncached(prompt_tokens, c)

    def ttft(self, prompt_tokens: int, c: Candidate) -> float:
        """The request's predicted time to first token on c."""
        return self._ttft_after(self.own_prefill_s(prompt_tokens, c), c)

    def _ttft_after(self, own_s: float, c: Candidate) -> float:
        """ttft with the request's own prefill (own_s) already priced: cost reuses it for its last term."""
        p = self.prior
        base = p.base_s if c.idle_ttft_base_s is None else c.idle_ttft_base_s
        per_running = p.per_running_s if c.idle_ttft_per_running_s is None else c.idle_ttft_per_running_s
        return c.lane_wait_s + own_s + base + per_running * c.load

    def cost(self, prompt_tokens: int, c: Candidate) -> float:
        own = self.own_prefill_s(prompt_tokens, c)
        return self._ttft_after(own, c) * (c.decode_batch + 1) ** DECODE_EXPONENT + own * c.waiting

    def costs(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
        return [self.cost(prompt_tokens, c) for c in candidates]

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate], mean_load: float | None = None
               ) -> Choice | None:
        return lowest_cost(self.costs(prompt_tokens, candidates), candidates) if candidates else None
