"""Placement formulas tried for issue 17 and not adopted: simulator arms only, never a sidecar `--policy`.

    python -m research grid --ours predictive-headroom --first-seed 201 --seeds 30 --out out/experiment/grid-headroom
    python -m research grid --credit gpu --ours lane --arms lane-product,lane-greedy --out out/experiment/g
    python -m research.placement_probe seeds --point queueing --arms predictive,predictive-headroom

The `predictive-*` arms are `predictive` (research/predictive.py) with one change. `lane-product` and
`lane-greedy` are the sidecar's `lane` policy (loadaware/policies/lane.py) at the engines' known speeds instead
of learned ones: `lane-product` exactly so, `lane-greedy` without the decode factor (a design bound: the
sidecar is not told the speeds). `lane-inflight` is `lane` with (load + 1) as its factor; the `lane-demand-*`,
`lane-recurring-*`, `lane-popular-*` and `lane-cap2*` arms use that factor only while a gate reads room in
the fleet's caches (and, for the popular ones, a popular prefix) from the routed block keys and the
simulator's capacity. research/notebook.md has what each did on the grid and why it was not adopted.
`VARIANT_ARMS` declares what each reads beyond the sidecar's candidates (`experiment.arms.Reads`);
`research.arms` registers them.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol, cast

from experiment.arms import Arm, Reads
from experiment.calibration import CALIBRATED
from loadaware.policies.banded import Banded
from loadaware.policies.base import Candidate, Choice, Needs, Policy, lowest_cost, own_uncached
from loadaware.policies.lane import DECODE_EXPONENT, Lane
from loadaware.policies.lane_spread import LaneSpread, in_flight_costs
from research.candidates import research, with_ttft_models
from research.predictive import Predictive
from sim.service_model import ServiceModel

if TYPE_CHECKING:
    from experiment.des import SimRequest, Simulation, _Engine, _Req


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
        for x, c in zip(out, map(research, candidates)):
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
        self.needs = Needs(signals=True)
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


class LaneInFlight(Lane):
    """`lane` with the in-flight factor (load(i) + 1)^1 in place of its decode factor while `room()` says the
    fleet's caches have room for more copies, and `lane`'s own factor otherwise:

        cost(i) = ttft(i) x (load(i) + 1) + own(i) x waiting(i)                     while room()
        cost(i) = lane's cost(i)                                                     otherwise

    Counting queued and prefilling requests spreads a hot prefix at once, which bursts need; the price is a
    copy of the prefix in another cache, free while the caches have room and a lost hit rate when they do
    not (research/notebook.md). This class has room always (`lane-inflight`); subclasses gate it."""

    def __init__(self, name: str = "lane-inflight") -> None:
        super().__init__(name=name)

    def room(self) -> bool:
        return True

    def costs(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
        if not self.room():
            return super().costs(prompt_tokens, candidates)
        return in_flight_costs(self, prompt_tokens, candidates)


class _RoutedDemand(LaneInFlight):
    """Sees every decided request's block keys (the simulation's `_track_decided`, wrapped) and the fleet's
    GPU cache capacity in blocks: a DES arm only."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.capacity_blocks = 0

    def bind_simulation(self, sim: Simulation) -> None:
        self.capacity_blocks = sum(e.svc.kv_capacity_blocks for e in sim.engines)
        decided = sim._track_decided

        def track(e: _Engine, r: _Req, matched: int, t: float) -> None:
            self.observe(r.sim.block_keys)
            decided(e, r, matched, t)

        sim._track_decided = track  # type: ignore[method-assign]

    def observe(self, keys: Sequence[int]) -> None:
        raise NotImplementedError


class LaneDemandOracle(_RoutedDemand):
    """Room while the distinct prompt blocks ever routed (the fleet's union, suffixes included) are fewer
    than `share` of the fleet's GPU cache blocks: the simulator's capacity, an oracle of what a sidecar could
    learn from `vllm:cache_config_info`."""

    def __init__(self, share: float = 0.5) -> None:
        super().__init__(f"lane-demand-{share:g}")
        self.share = share
        self._seen: set[int] = set()

    def observe(self, keys: Sequence[int]) -> None:
        self._seen.update(keys)

    def room(self) -> bool:
        return len(self._seen) < self.share * self.capacity_blocks


class LaneRecurring(_RoutedDemand):
    """Room while the recurring working set is smaller than `share` of the fleet's GPU cache blocks. The
    recurring working set: blocks routed again while still among the last `window` x capacity distinct blocks
    routed (an LRU over the routed stream; at window 1 a block whose reuse distance is longer would miss in
    any placement), so a request's unique suffix never counts. Sampled by key (1 in `sample`; SHARDS'
    spatial sampling, Waldspurger et al., FAST '15) so that its cost per request is a few dict operations."""

    def __init__(self, share: float = 0.5, sample: int = 1, name: str | None = None, window: float = 1.0) -> None:
        super().__init__(name or f"lane-recurring-{share:g}" + (f"-s{sample}" if sample > 1 else ""))
        self.share = share
        self.sample = sample
        self.window = window  # the LRU's size in fleet capacities
        self._lru: OrderedDict[int, bool] = OrderedDict()  # sampled key -> seen again
        self.recurring = 0

    def observe(self, keys: Sequence[int]) -> None:
        lru, mod = self._lru, self.sample
        bound = max(1, int(self.window * self.capacity_blocks) // mod)
        for k in keys:
            if mod > 1 and k % mod:
                continue
            again = lru.get(k)
            if again is None:
                lru[k] = False
                if len(lru) > bound and lru.popitem(last=False)[1]:
                    self.recurring -= 1
            else:
                lru.move_to_end(k)
                if not again:
                    lru[k] = True
                    self.recurring += 1

    def room(self) -> bool:
        return self.recurring * self.sample < self.share * self.capacity_blocks


class LanePopular(LaneRecurring):
    """`lane-recurring` whose in-flight factor also needs the request's prefix to be popular: the prompt's
    block at the end of its longest match anywhere in the fleet has been routed at least `min_count` times
    (1 = the number of engines) while among the last `window` x capacity distinct blocks routed. A copy made by a miss
    then serves many later requests (a hot shared prefix), not a conversation's next turn or two."""

    def __init__(self, share: float = 0.8, min_count: int = 1, name: str | None = None, window: float = 1.0
                 ) -> None:
        super().__init__(share, 1, name or f"lane-popular-{share:g}-c{min_count}", window)
        self.min_count = min_count
        self.block_size = CALIBRATED.block_size  # the simulator's GPU blocks, which matched tokens count
        self._counts: OrderedDict[int, int] = OrderedDict()
        self._keys: Sequence[int] = ()

    def bind_simulation(self, sim: Simulation) -> None:
        super().bind_simulation(sim)
        decide = sim._decide

        def deciding(s: SimRequest) -> tuple[_Engine, int]:
            self._keys = s.block_keys
            return decide(s)

        sim._decide = deciding  # type: ignore[method-assign]

    def observe(self, keys: Sequence[int]) -> None:
        super().observe(keys)
        counts, bound = self._counts, max(1, int(self.window * self.capacity_blocks))
        for k in keys:
            counts[k] = counts.pop(k, 0) + 1
            if len(counts) > bound:
                counts.popitem(last=False)

    def popular(self, candidates: Sequence[Candidate]) -> bool:
        deepest = max((c.matched_tokens for c in candidates), default=0) // self.block_size
        if deepest < 1 or deepest > len(self._keys):
            return False
        need = self.min_count if self.min_count > 1 else len(candidates)
        return self._counts.get(self._keys[deepest - 1], 0) >= need

    def costs(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
        if self.room() and self.popular(candidates):
            return super().costs(prompt_tokens, candidates)
        return Lane.costs(self, prompt_tokens, candidates)


class LaneDiscovered(LanePopular):
    """`lane-cap2-popular` that also waits until every prompt head it has seen (the prompt's first block: which
    shared prefix or system prompt it starts with) has been seen at least twice (no singleton among them, the
    f1 = 0 of a species count): until then the working set may still be growing, as in a cold start."""

    def __init__(self) -> None:
        super().__init__(1.0, 1, "lane-cap2-popular-discovered", 2.0)
        self._heads: dict[int, int] = {}
        self.singletons = 0

    def observe(self, keys: Sequence[int]) -> None:
        super().observe(keys)
        if keys:
            n = self._heads.get(keys[0], 0) + 1
            self._heads[keys[0]] = n
            self.singletons += 1 if n == 1 else -1 if n == 2 else 0

    def room(self) -> bool:
        return self.singletons == 0 and super().room()


@dataclass
class LaneSpreadPrior(LaneSpread):
    """lane-spread that never reads the learned TTFT prices: the prior's, as behind a BUFFERED Envoy."""

    name: str = "lane-spread-prior"

    def own_prefill_s(self, prompt_tokens: int, c: Candidate) -> float:
        return self.prior.per_token_s * own_uncached(prompt_tokens, c)

    def _ttft_after(self, own_s: float, c: Candidate) -> float:
        p = self.prior
        return c.lane_wait_s + own_s + p.base_s + p.per_running_s * c.load


@dataclass
class LaneSpreadColdLoadaware(LaneSpread):
    """lane-spread that scores as the seed's loadaware while the working set is unknown (new heads arriving)."""

    name: str = "lane-spread-cold-loadaware"

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate], mean_load: float | None = None
               ) -> Choice | None:
        if candidates and candidates[0].cache_demand is None:
            return self.when_all_queue.choose(prompt_tokens, candidates, mean_load)
        return super().choose(prompt_tokens, candidates, mean_load)


@dataclass
class LaneSpreadColdSpread(LaneSpread):
    """lane-spread that counts every request in flight (its spreading factor) while the working set is unknown."""

    name: str = "lane-spread-cold-spread"

    def costs(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> list[float]:
        if candidates and candidates[0].cache_demand is None:
            return in_flight_costs(self, prompt_tokens, candidates)
        return super().costs(prompt_tokens, candidates)


@dataclass
class LaneSpreadWithoutAllQueueing(LaneSpread):
    """lane-spread before its all-queueing rule: its own cost even while every endpoint queues."""

    name: str = "lane-spread-without-all-queueing"

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate], mean_load: float | None = None
               ) -> Choice | None:
        return self.cheapest(prompt_tokens, candidates) if candidates else None


@dataclass
class LaneSpreadQueuedLoad(LaneSpreadWithoutAllQueueing):
    """lane-spread (before the all-queueing rule) whose decode factor counts every request in flight on an endpoint
    that queues (waiting > 0): the decode batch is at the engine's cap on every saturated engine and hides the
    queue's length. Tried for the all-queueing rule and not adopted (research/notebook.md)."""

    name: str = "lane-spread-queued-load"

    def cost_in(self, prompt_tokens: int, c: Candidate, spread: bool) -> float:
        if spread or c.waiting <= 0:
            return super().cost_in(prompt_tokens, c, spread)
        own = self.own_prefill_s(prompt_tokens, c)
        return self._ttft_after(own, c) * (max(c.load, c.decode_batch) + 1) ** DECODE_EXPONENT + own * c.waiting


@dataclass
class LaneSpreadAnyQueueLoadaware(LaneSpreadWithoutAllQueueing):
    """lane-spread that chooses as the seed's loadaware while any candidate queues (waiting > 0), not only while
    all do. Tried for the all-queueing rule and not adopted (research/notebook.md)."""

    name: str = "lane-spread-anyq-loadaware"

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate], mean_load: float | None = None
               ) -> Choice | None:
        if any(c.waiting > 0 for c in candidates):
            return self.when_all_queue.choose(prompt_tokens, candidates, mean_load)
        return super().choose(prompt_tokens, candidates, mean_load)


class _SimulationBound(Protocol):
    def bind_simulation(self, sim: Simulation) -> None: ...


def bind_simulation(policy: Policy, sim: Simulation) -> None:
    """`Reads.simulation` of the design bounds below: hands the policy the simulation's clock and engines."""
    cast(_SimulationBound, policy).bind_simulation(sim)


TTFT_MODELS = Reads(ttft_models=with_ttft_models)  # predictive's prices: each engine's learned TTFT model
SIMULATION = Reads(simulation=bind_simulation)  # the engines' known speeds, the clock, the routed block keys
NOTHING = Reads()  # the sidecar's candidates only


# Classes or partials of them, not closures: the grid pickles arms into its worker processes.
VARIANTS: dict[str, tuple[Callable[[], Policy], Reads]] = {
    "predictive-crowd-clamped": (PredictiveClampedCrowd, TTFT_MODELS),
    "predictive-headroom": (PredictiveHeadroom, TTFT_MODELS),
    "lane-greedy": (LaneGreedy, SIMULATION),
    "lane-product": (LaneProduct, SIMULATION),
    "lane-inflight": (LaneInFlight, NOTHING),
    "lane-demand-0.5": (partial(LaneDemandOracle, 0.5), SIMULATION),
    "lane-demand-0.8": (partial(LaneDemandOracle, 0.8), SIMULATION),
    "lane-recurring-0.5": (partial(LaneRecurring, 0.5), SIMULATION),
    "lane-recurring-0.8": (partial(LaneRecurring, 0.8), SIMULATION),
    "lane-recurring-1": (partial(LaneRecurring, 1.0), SIMULATION),
    "lane-recurring-0.5-s16": (partial(LaneRecurring, 0.5, 16), SIMULATION),
    "lane-popular-c1": (partial(LanePopular, math.inf, 1, "lane-popular-c1"), SIMULATION),
    "lane-popular-0.8-c1": (partial(LanePopular, 0.8, 1), SIMULATION),
    "lane-popular-0.8-c8": (partial(LanePopular, 0.8, 8), SIMULATION),
    # cap2: the recurring blocks seen through an LRU of twice the fleet's capacity, room while fewer than the
    # capacity: the caches hold every recurring block once with room to spare.
    "lane-cap2": (partial(LaneRecurring, 1.0, 1, "lane-cap2", 2.0), SIMULATION),
    "lane-cap2-popular": (partial(LanePopular, 1.0, 1, "lane-cap2-popular", 2.0), SIMULATION),
    "lane-cap2-popular-c8": (partial(LanePopular, 1.0, 8, "lane-cap2-popular-c8", 2.0), SIMULATION),
    "lane-cap2-popular-discovered": (LaneDiscovered, SIMULATION),
    # lane-spread without its pile-up guard (loadaware/policies/bounded.py), and without its learned prices
    "lane-spread-unbounded": (partial(LaneSpread, max_share=1.0), NOTHING),
    "lane-spread-prior": (LaneSpreadPrior, NOTHING),
    "lane-spread-cold-loadaware": (LaneSpreadColdLoadaware, NOTHING),
    "lane-spread-cold-spread": (LaneSpreadColdSpread, NOTHING),
    "lane-spread-without-all-queueing": (LaneSpreadWithoutAllQueueing, NOTHING),
    "lane-spread-queued-load": (LaneSpreadQueuedLoad, NOTHING),
    "lane-spread-anyq-loadaware": (LaneSpreadAnyQueueLoadaware, NOTHING),
    # banded at other widths of its band (loadaware/policies/banded.py; the design draws chose among them)
    "banded-0.1": (partial(Banded, 0.1, name="banded-0.1"), NOTHING),
    "banded-0.5": (partial(Banded, 0.5, name="banded-0.5"), NOTHING),
    "banded-1": (partial(Banded, 1.0, name="banded-1"), NOTHING),
}
VARIANT_ARMS: tuple[Arm, ...] = tuple(Arm(name, name, factory=factory, reads=reads)
                                      for name, (factory, reads) in VARIANTS.items())
