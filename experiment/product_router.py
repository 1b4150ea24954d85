"""The sidecar's own decision core, built by the sidecar's own builder (loadaware/routing/builder.py, as
`loadaware.app` builds it) from the settings table's defaults, on a simulation's clock.

The discrete-event simulator (experiment.des) routes every request through this: the product's `Decider` (every
stage: the filter with endpoint health and models, the producers, the policy's selection with the queued-prefix
credit and the working set, the ranked fallbacks), its `LoadTracker` (in-flight counts refined by scrapes; the
ranking of a large pool), its `SignalTracker` (token signals, TTFT models, prefill clocks, the BUFFERED-mode
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

from loadaware.config import Settings, core_options
from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.load.tracker import EngineStats
from loadaware.policies.base import Candidate, Choice, Needs, Policy
from loadaware.routing.builder import CoreInputs, build_core
from loadaware.routing.producers import StateLocator
from loadaware.routing.request import InferenceRequest
from testkit.decision_core import SimulatedPrefix


class TwoArgPolicy:
    """A policy whose `choose` takes no pool mean (the peers' and research arms): the pipeline passes one,
    unpruned it is None. `widen` turns the pipeline's candidates into what the arm reads, in the same order (the
    simulator adds the signals only the research arms read: research.candidates)."""

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
        settings = Settings()  # the settings table's defaults: what a sidecar run with no flags decides with
        prefix = SimulatedPrefix(source, clock, settings)
        self.exact, self.approx = prefix.exact, prefix.approx
        # The sidecar's own builder, on the simulation's clock: ranking, health, fallbacks and every default as the
        # app has them. ttft_model: for a research arm that reads it.
        self.core = build_core(core_options(settings), CoreInputs(
            self.registry, self.lifecycle, clock, prefix_source=prefix.source, prefix_listeners=prefix.listeners(),
            ttft_model=ttft_model), policy=policy)
        self.decider, self.loads, self.signals = self.core.decider, self.core.loads, self.core.signals
        prefix.watch(self.registry)
        # Where stored responses live (the app's StateHolders; None: no state routing, as a peer router has none):
        # the simulator teaches it each stored response's engine.
        self.state = state
        self.decider.producers.state = state

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
