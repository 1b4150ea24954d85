"""The sidecar's own decision pipeline, wired as `loadaware.app` wires it, on a simulation's clock.

The discrete-event simulator (experiment.des) routes every request through this: the product's `Decider`
(candidates, the queued-prefix credit, the working set, the policy, its fallbacks), its `LoadTracker` (in-flight
counts refined by scrapes), its `SignalTracker` (token signals, TTFT models, prefill clocks, the BUFFERED-mode
estimate) and, for the approximate source, its `ApproxPrefixSource`, all hearing the same lifecycle events the
ext_proc server emits. So a grid figure is the shipped code's figure, not a twin's.

What the simulator supplies is what the sidecar reads from the outside: the prefix source's answer for the
exact sources (stock LMCache, a multi-holder LMCache lookup, KV events: experiment.des computes them from the
engines' caches), the engines' scrapes, and whether the response path shows first chunks (the picker's full
duplex does; a BUFFERED Envoy does not, and `first_chunk` is then never called).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.load.signals import SignalTracker
from loadaware.load.tracker import EngineStats, LoadTracker
from loadaware.policies.base import Candidate, Choice, Needs, Policy
from loadaware.prefix.approx import ApproxIndex, ApproxPrefixSource
from loadaware.prefix.combined import CombinedPrefixSource, Member
from loadaware.prefix.source import PrefixSource
from loadaware.prefix.wiring import APPROX_TOKEN_BLOCK
from loadaware.routing.builder import build_decider
from loadaware.routing.producers import StateLocator
from loadaware.routing.request import InferenceRequest
from loadaware.telemetry.metrics import Metrics

# The sidecar's defaults (loadaware/config.py): the approximate source's per-engine capacity and decay.
APPROX_CAPACITY_TOKENS = 100_000
APPROX_TTL_S = 300.0
SCRAPE_STALE_S = 5.0


class FixedAnswer:
    """An exact prefix source whose answer the simulator sets before each decision (what LMCache or the KV-events
    index would say of the engines' caches at that moment)."""

    name = "simulated"
    exact = True

    def __init__(self) -> None:
        self.answer: dict[str, int] = {}

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        return self.answer


class TwoArgPolicy:
    """A policy whose `choose` takes no pool mean (the peers' and research arms): the pipeline passes one,
    unpruned it is None. `widen` turns the pipeline's candidates into what the arm reads, in the same order (the
    simulator adds the signals only the experiment's arms read: experiment.candidates)."""

    def __init__(self, policy: Any, widen: Callable[[Sequence[Candidate]], Sequence[Candidate]] | None = None
                 ) -> None:
        self.inner = policy
        self.name: str = policy.name
        self.needs: Needs = policy.needs
        self.formula: str = getattr(policy, "formula", "")
        self._widen = widen

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate],
               mean_load: float | None = None) -> Choice | None:
        if self._widen is not None:
            candidates = self._widen(candidates)
        choice: Choice | None = self.inner.choose(prompt_tokens, candidates)
        return choice


def _run(coro: Coroutine[Any, Any, Decision]) -> Decision:
    """Drive a decision that never suspends (every source here answers at once) without an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        decision: Decision = done.value
        return decision
    coro.close()
    raise RuntimeError("a simulated decision awaited something")


class ProductRouter:
    """One sidecar: `source` is "exact" (the simulator sets `exact.answer`), "approx" (the product's own
    approximate index), "exact+approx" (both, combined as the sidecar combines LMCache with its record) or "none"
    (no prefix source: without a tokenizer the exact sources see no tokens)."""

    def __init__(self, policy: Policy, endpoints: Sequence[str], clock: Callable[[], float], source: str,
                 ttft_model: bool = False, state: StateLocator | None = None) -> None:
        self.lifecycle = RequestLifecycle()
        self.registry = EndpointRegistry(endpoints)
        self.loads = LoadTracker(SCRAPE_STALE_S, clock=clock)
        self.signals = SignalTracker(clock, ttft_model=ttft_model)  # ttft_model: for a research arm that reads it
        self.exact = FixedAnswer()
        self.approx: ApproxPrefixSource | None = None
        prefix: PrefixSource | None = None
        if source in ("approx", "exact+approx"):
            index = ApproxIndex(max(1, APPROX_CAPACITY_TOKENS // APPROX_TOKEN_BLOCK), APPROX_TOKEN_BLOCK,
                                APPROX_TTL_S)
            self.approx = prefix = ApproxPrefixSource(index, Metrics(policy.name), clock)
        if source == "exact":
            prefix = self.exact
        elif source == "exact+approx":
            # Stock LMCache with the sidecar's record beside it, as the sidecar's default combines them
            # (loadaware/prefix/combined.py): LMCache names one holder per chunk, the record adds the others.
            assert self.approx is not None
            prefix = CombinedPrefixSource([Member(self.exact, set, complete=False)], self.approx)
        elif source not in ("approx", "none"):
            raise ValueError(f"unknown source {source!r}")
        # Where stored responses live (loadaware.fleet.state_holders.StateHolders, as the app wires it; None: no
        # state routing, as a peer router has none): the simulator teaches it each stored response's engine.
        self.state = state
        self.decider = build_decider(policy, self.registry, self.loads, self.lifecycle, None, prefix,
                               signals=self.signals, state=state)
        # As loadaware.app subscribes them: counts first, then the token signals, then the approximate index.
        self.lifecycle.subscribe(self.loads)
        self.lifecycle.subscribe(self.signals)
        self.lifecycle.subscribe_progress(self.signals)
        self.loads.subscribe_scrapes(self.signals.scraped)
        if self.approx is not None:
            self.lifecycle.subscribe(self.approx)
        for endpoint in self.registry.snapshot():
            self.loads.join(endpoint)

    def decide(self, tokens: list[int] | None) -> Decision:
        """The sidecar's decision for a completions request with these prompt token ids (None: a prompt the
        sidecar cannot tokenize, as without a tokenizer for an exact source)."""
        request = InferenceRequest("completions", prompt=tokens if tokens is not None else "?")
        return _run(self.decider.decide(request))

    def attach_state(self, state: StateLocator) -> None:
        """State routing on (an arm that runs it: every sidecar arm, as the app always wires it)."""
        self.state = self.decider.producers.state = state

    def decide_request(self, request: InferenceRequest) -> Decision:
        """The sidecar's decision for a request built by the caller (e.g. one naming a stored response:
        `state_id`); its locator must answer without suspending (a learned holder, or no probe)."""
        return _run(self.decider.decide(request))

    def first_chunk(self, decision: Decision) -> None:
        self.lifecycle.first_chunk(decision)

    def ended(self, decision: Decision) -> None:
        self.lifecycle.ended(decision)

    def scraped(self, endpoint: str, stats: EngineStats) -> None:
        self.loads.record(endpoint, stats)

    def expire(self) -> None:
        if self.approx is not None:
            self.approx.expire()
