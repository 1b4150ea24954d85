"""A routed request's lifecycle: decided -> (served) -> ended, and the parts that listen to it.

The decision pipeline emits `decided` at the moment of choice; the ext_proc server emits `served` when the
response path learns which engine served (a retry may have walked the ranked list to another one) and
`ended` exactly once when the request's stream ends, however it ended. `responded` carries the response's
status to the outcome listeners (failure-aware routing, response metrics). Load accounting, the approximate
prefix index and metrics subscribe; none of them is called by the pipeline or the server directly, so
request state flows one way (docs/architecture.md, "Request lifecycle").

A `Decision` is the request's record for its whole life: the stream keeps it, listeners annotate it
(the load module parks its lease on it) and read it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from loadaware.policies.base import Candidate

log = logging.getLogger(__name__)

# A decision made only to be shown (Explain) must leave no trace: no metric, health, cache or memo changes. The
# flag rides the context (asyncio tasks and the tokenizer's worker threads inherit it), so every helper on the
# decision's path can tell without a parameter threaded through each call.
_PREVIEW: ContextVar[bool] = ContextVar("loadaware_preview", default=False)


def previewing() -> bool:
    """True inside a preview decision: read state, change nothing."""
    return _PREVIEW.get()


@contextmanager
def preview() -> Iterator[None]:
    token = _PREVIEW.set(True)
    try:
        yield
    finally:
        _PREVIEW.reset(token)


STATE_RULE = "state"  # Decision.rule of a request placed on its stored response's holder (state beats load)


@dataclass(slots=True, eq=False)
class Decision:
    request_id: str
    endpoint: str | None  # the choice; None: Envoy's own fallback picks (or the picker answers 503)
    outcome: str  # routed | fallback_load_only | no_endpoints | no_eligible_endpoints | unknown_model
    reasons: tuple[str, ...]
    prompt_tokens: int
    # The endpoints scored: the pool, or in a large pool those that could rank (routing/pruning.py). The
    # recent-decisions ring, the last listener, trims them to the ranked head when it records the decision.
    candidates: tuple[Candidate, ...]
    scores: tuple[float, ...]
    stages: dict[str, float]
    total_s: float
    at: float = field(default_factory=time.time)
    # Prompt token ids until the decision is announced (its listeners read them: the approximate index records
    # them, the queued-prefix index holds their blocks); then dropped, so a request in flight does not keep its
    # prompt (an engine that hangs keeps every request sent to it in flight). Never rendered: a token list is
    # the prompt's text.
    tokens: Sequence[int] | None = None
    ranked: tuple[str, ...] = ()  # the choice, then the fallbacks a proxy's retries walk, best first
    # How many endpoints the decision chose among; `candidates` may be fewer (the ones that could rank, see
    # routing/pruning.py), and then `mean_load` is the pool's mean load (None: the candidates' own).
    pool_size: int = 0
    mean_load: float | None = None
    served: str | None = None  # the engine that served, once known; starts as the choice
    served_reported: bool = False  # the proxy said who served (else a response is the proxy's own)
    status: int | None = None  # the response's HTTP status, once its headers came back
    model: str | None = None  # the request body's `model`, when it names one
    policy: str = ""  # the policy that decided (its name; `auto` shows what it resolved to)
    rule: str = ""  # which of its rules chose, for a policy with more than one ("": its usual one; Choice.rule)
    # A request naming a stored response: how its holder was found (known | probed | not_found | probe_failed |
    # probe_busy | no_locator | error; fleet/state_holders.py); "" for a request with no state. rule is "state" when
    # it placed it.
    state: str = ""
    # Admission (loadaware/admission): the request's objective and fairness id as its headers named them, the
    # priority its objective has, and the seconds it was held before this decision.
    objective: str = ""
    fairness_id: str = ""
    priority: int = 0
    admission_wait_s: float = 0.0
    # Session affinity (loadaware/routing/affinity.py): the request's session key (never shown: it may name a
    # user) and what affinity did: kept (the session's endpoint), moved (it could not take the request), new
    # (the session had none); "" without a session key or with affinity off.
    session: str = ""
    affinity: str = ""
    lease: Any = None  # the load module's receipt for this request's in-flight count
    signals: Any = None  # the token-signal tracker's receipt (loadaware.load.signals)
    queued: Any = None  # the queued-prefix index's receipt (loadaware.prefix.queued)
    approx: Any = None  # the approximate index's receipt: the block keys it recorded (loadaware.prefix.approx)
    trace: Any = None  # the decision's span while tracing is on (loadaware.telemetry.tracing), else None
    first_chunk: bool = False  # the response path has seen the first response body chunk
    ended: bool = False

    def __post_init__(self) -> None:
        if self.served is None:
            self.served = self.endpoint

    @property
    def pinned(self) -> bool:
        """Only its endpoint can serve it: the holder of the stored response it names. A proxy's retry elsewhere
        meets that engine's 404 for a response it never held, so its retries go back to it (extproc/replies.py)."""
        return self.rule == STATE_RULE

    def as_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id, "policy": self.policy, "endpoint": self.endpoint,
            "ranked": list(self.ranked),
            "served": self.served, "status": self.status,
            "outcome": self.outcome, "reasons": list(self.reasons), "prompt_tokens": self.prompt_tokens,
            "candidates": [{"endpoint": c.endpoint, "matched_tokens": c.matched_tokens, "load": c.load,
                            **_signals_shown(c), "score": s} for c, s in zip(self.candidates, self.scores)],
            "stages_ms": {k: round(v * 1e3, 3) for k, v in self.stages.items()},
            "total_ms": round(self.total_s * 1e3, 3), "at": self.at,
            **({"objective": self.objective, "priority": self.priority} if self.objective else {}),
            **({"fairness_id": self.fairness_id} if self.fairness_id else {}),
            **({"admission_wait_ms": round(self.admission_wait_s * 1e3, 3)} if self.admission_wait_s else {}),
            **({"affinity": self.affinity} if self.affinity else {}),
            **({"rule": self.rule} if self.rule else {}),
            **({"state": self.state} if self.state else {}),
        }


# The token signals and learned TTFT model a candidate carried (policies that read them get them filled):
# what the decision saw beyond matched tokens and load. Unset ones (0 / None) are left out.
_SIGNAL_FIELDS = tuple(f.name for f in fields(Candidate) if f.name not in ("endpoint", "matched_tokens", "load"))


def _signals_shown(c: Candidate) -> dict[str, float]:
    return {name: v for name in _SIGNAL_FIELDS if (v := getattr(c, name))}


class LifecycleListener(Protocol):
    def on_decided(self, decision: Decision) -> None: ...

    def on_served(self, decision: Decision, previous: str | None) -> None:
        """`decision.served` is now the engine that served; `previous` is who was credited before."""
        ...

    def on_ended(self, decision: Decision) -> None: ...


class OutcomeListener(Protocol):
    def on_responded(self, decision: Decision, status: int) -> None:
        """The response headers came back: `decision.served` answered with `status`."""
        ...


# (event, listener, exception): told when a listener raises; the others still get the event.
ListenerFailure = Callable[[str, object, Exception], None]


class ProgressListener(Protocol):
    def on_first_chunk(self, decision: Decision) -> None:
        """The first response body chunk passed: the engine has prefilled the prompt."""
        ...


class RequestLifecycle:
    """Fans each event out to the listeners, in subscription order. Listeners run synchronously and must
    not block: `decided` runs on the hot path between the choice and the reply."""

    def __init__(self, on_failure: ListenerFailure | None = None) -> None:
        self._listeners: list[LifecycleListener] = []
        self._outcome_listeners: list[OutcomeListener] = []
        # None: a traceback per failure; the sidecar counts them and logs them rate-limited instead
        self.on_failure = on_failure
        self._progress_listeners: list[ProgressListener] = []

    def _failed(self, event: str, listener: object, exc: Exception) -> None:
        if self.on_failure is None:
            log.error("lifecycle listener %r failed on %s", listener, event, exc_info=exc)
            return
        try:
            self.on_failure(event, listener, exc)
        except Exception:  # noqa: BLE001 - the report of a failure must not become one
            pass

    def subscribe_progress(self, listener: ProgressListener) -> None:
        self._progress_listeners.append(listener)

    def first_chunk(self, decision: Decision | None) -> None:
        """Once per request, when the response path sees its first body chunk (only the full-duplex path sees
        bodies); the caller checks `decision.first_chunk` first so later chunks cost one attribute read."""
        if decision is None or decision.first_chunk or decision.ended:
            return
        decision.first_chunk = True
        for listener in self._progress_listeners:
            try:
                listener.on_first_chunk(decision)
            except Exception as exc:  # noqa: BLE001 - on the response path: counted and rate-limited by on_failure
                self._failed("first_chunk", listener, exc)

    def subscribe(self, listener: LifecycleListener) -> None:
        self._listeners.append(listener)

    def subscribe_outcomes(self, listener: OutcomeListener) -> None:
        self._outcome_listeners.append(listener)

    def decided(self, decision: Decision) -> None:
        for listener in self._listeners:
            try:
                listener.on_decided(decision)
            except Exception as exc:  # noqa: BLE001 - one listener's failure never costs the others
                self._failed("decided", listener, exc)
        decision.tokens = None  # read by the listeners above; what a later event needs, each kept in its receipt

    def served(self, decision: Decision, endpoint: str) -> None:
        """The response path reports who served. Only a change is news; after the end it is too late."""
        if decision.ended or endpoint == decision.served or decision.endpoint is None:
            return
        previous, decision.served = decision.served, endpoint
        for listener in self._listeners:
            try:
                listener.on_served(decision, previous)
            except Exception as exc:  # noqa: BLE001 - one listener's failure never costs the others
                self._failed("served", listener, exc)

    def responded(self, decision: Decision | None, status: int | None, served: str | None) -> None:
        """The response path saw the response headers: who served (if the proxy says) and the status. Once
        per request; a response to a request the sidecar did not route (no choice) tells nothing."""
        if decision is None or decision.ended or decision.endpoint is None or decision.status is not None:
            return
        if served is not None:
            decision.served_reported = True
            self.served(decision, served)
        if status is None:
            return
        decision.status = status
        for listener in self._outcome_listeners:
            try:
                listener.on_responded(decision, status)
            except Exception as exc:  # noqa: BLE001 - one listener's failure never costs the others
                self._failed("responded", listener, exc)

    def ended(self, decision: Decision | None) -> None:
        """Exactly once per decision, whatever ended the request; a no-op for None or a repeat."""
        if decision is None or decision.ended:
            return
        decision.ended = True
        for listener in self._listeners:
            try:
                listener.on_ended(decision)
            except Exception as exc:  # noqa: BLE001 - one listener's failure never costs the others
                self._failed("ended", listener, exc)
        decision.tokens = None
