"""One request's decision in the making: what every stage of the pipeline reads and extends
(routing/pipeline.py lists the stages, in order).

A stage that fails degrades the decision, never the request: it names itself in `reasons` (counted in
`loadaware_fallbacks_total`, logged once per reason per interval) and the next stages go on with less.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loadaware.policies import Candidate, Choice
from loadaware.routing.request import InferenceRequest
from loadaware.telemetry.faults import RateLimitedLog, describe

log = logging.getLogger("loadaware.routing.pipeline")
faults = RateLimitedLog(log)  # one line per failing helper per interval, not a traceback per request

ALL_FAILING = "all_endpoints_failing"


@dataclass(slots=True)
class DecisionContext:
    # What the caller asked.
    request: InferenceRequest | None
    request_id: str = ""
    count: bool = True  # False: a preview (Explain): nothing hears of it and no stage changes any state
    subset: frozenset[str] | None = None  # the proxy's hint: only these endpoints may be chosen
    session: str = ""  # the request's session key (--session-header; "": none)
    # Admission's test of an engine's room for the request's band (None: admission off): routing/room.py.
    room: Callable[[str], bool] | None = None
    started: float = field(default_factory=time.perf_counter)
    stages: dict[str, float] = field(default_factory=dict)  # seconds per stage, for the decision's record
    reasons: list[str] = field(default_factory=list)  # what degraded the decision, and why
    # What the stages found, in the order they run.
    endpoints: tuple[str, ...] = ()  # the pool: the fleet in the subset, serving the model (filter)
    excluded: frozenset[str] = frozenset()  # the pool's engines failing their requests (filter)
    tokens: list[int] = field(default_factory=list)  # the prompt's token ids (producers: tokens)
    prompt_total: int = 0  # the prompt's estimated length when only its head was tokenized
    matches: dict[str, int] = field(default_factory=dict)  # endpoint -> prompt tokens it holds (producers: prefix)
    holder: str | None = None  # the engine holding the stored response the request needs (producers: state)
    state: str = ""  # how the holder was found ("" for a request with no state)
    sampled: list[int] | None = None  # the prompt's sampled block keys, for the working set
    sticky: str | None = None  # the session's endpoint (affinity)
    candidates: tuple[Candidate, ...] = ()  # what the policy chose among (selection)
    choice: Choice | None = None
    mean_load: float | None = None  # the pool's mean load when the candidates are part of it (pruned)
    order: tuple[str, ...] = ()  # the choice, then its fallbacks
    affinity: str = ""  # what affinity did: kept | moved | new ("" when off)

    @property
    def model(self) -> str | None:
        return self.request.model if self.request is not None else None

    @property
    def prompt_tokens(self) -> int:
        return max(len(self.tokens), self.prompt_total)

    @property
    def pool_size(self) -> int:
        return len(self.endpoints) - len(self.excluded)

    def degrade(self, reason: str, exc: BaseException) -> None:
        degraded(self.reasons, reason, exc)

    def timed(self, stage: str, since: float) -> None:
        self.stages[stage] = time.perf_counter() - since


def degraded(reasons: list[str] | None, reason: str, exc: BaseException) -> None:
    """A helper failed: the decision names it (counted by the decision metrics) and it is logged once per
    reason per interval."""
    if reasons is not None and reason not in reasons:
        reasons.append(reason)
    faults.log(logging.WARNING, reason, "%s: %s", reason, describe(exc))
