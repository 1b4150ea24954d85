"""Which engines are failing: outcomes from the response path and the scrapes, ejection with backoff, probing.

A load-aware router's classic failure is an engine that fails fast: it answers 500 in a millisecond, so it
always looks idle and draws most of the traffic. Every request's outcome is therefore fed back here:

    healthy --(N consecutive failures)--> ejected --(backoff elapsed)--> probing --(success)--> healthy
                                            ^                               |
                                            +---------(failure)-------------+

- Only upstream-caused outcomes count (`upstream_failure`): a 500, 502, 503 or 504 (Envoy's own 504 after the
  route timeout included) from the engine the proxy reports as having served, or an engine the proxy walked
  past on the ranked list (its retries move on only after a connect failure, a reset or a 5xx, or because
  Envoy's outlier detection ejected the engine itself). A 4xx is the client's; 501, 505 and the other 5xx
  answer what a client asked for (a method, a protocol version), not an engine's health; a response
  without the proxy's served-endpoint report is the proxy's own reply (no engine was reached); a client
  abort has no outcome at all.
- At most `max_ejection_percent` of a decision's candidates are left out (50%, as Envoy's outlier
  detection): past that, the ones due back soonest are admitted again, so a burst of failures cannot pile
  the whole fleet's traffic onto the last engine standing.
- Ejection lasts base * 2^(k-1) seconds for the k-th ejection in a row, capped: a long-dead engine costs
  one probe per cap, a healed one is back within a cap.
- Probing admits ONE request at a time (the proxy's retries take it to the next engine if it fails); its
  outcome decides. A request that ends without an outcome (client abort) frees the probe slot.
- An engine whose scrape times out or refuses the connection `unreachable_after` times in a row is ejected
  until a scrape succeeds again: a hung engine must not be probed with a client's request, which would wait
  for the route timeout. Scrape successes do not heal request failures (a 500-answering engine serves its
  /metrics fine).

When every candidate is out, the decision uses them all (fail open: the proxy's retries and outlier
detection still act) and says so. `eligible` is a pure query (Explain asks it too): an ejection whose
backoff has elapsed becomes a probe only when a request is actually routed there. Pure logic: the clock is
injected, nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loadaware.lifecycle import Decision

HEALTHY, EJECTED, PROBING = "healthy", "ejected", "probing"
# Failure kinds, as metrics and the debug API name them.
HTTP_5XX, TIMEOUT, PASSED_OVER, UNREACHABLE = "http_5xx", "timeout", "passed_over", "unreachable"
GATEWAY_TIMEOUT = 504
# The statuses that say an engine (or the path to it) failed: internal error, bad gateway (connect failure,
# reset), unavailable (overflow, no healthy upstream, the engine's own 503), gateway timeout.
UPSTREAM_FAILURE_STATUSES = frozenset({500, 502, 503, 504})

StateListener = Callable[[str, str, str], None]  # (endpoint, new state, reason)


@dataclass(frozen=True)
class HealthOptions:
    failures_to_eject: int = 3  # consecutive request failures (0: never eject on them)
    base_ejection_s: float = 1.0
    max_ejection_s: float = 5.0
    unreachable_after: int = 2  # consecutive scrape transport failures (0: never eject on them)
    max_ejection_percent: float = 50.0  # of a decision's candidates, at most this share is left out


def upstream_failure(status: int) -> str | None:
    """The failure kind an engine's answer counts as, or None when it says nothing against the engine."""
    if status not in UPSTREAM_FAILURE_STATUSES:
        return None
    return TIMEOUT if status == GATEWAY_TIMEOUT else HTTP_5XX


@dataclass(slots=True)
class EndpointRecord:
    state: str = HEALTHY
    reason: str = ""
    consecutive: int = 0  # request failures in a row
    ejections: int = 0  # ejections in a row: the backoff's exponent
    until: float = 0.0  # end of the current ejection (monotonic)
    unreachable: bool = False  # ejected until a scrape succeeds
    scrape_failures: int = 0  # scrape transport failures in a row
    probe: Decision | None = None  # the one request in flight while probing
    failures: dict[str, int] = field(default_factory=dict)  # since start, by kind
    successes: int = 0


@dataclass(frozen=True, slots=True)
class HealthView:
    """One endpoint's health as the debug API shows it."""
    state: str
    reason: str
    consecutive_failures: int
    ejections: int
    ejected_for_s: float
    failures: dict[str, int]
    successes: int


class EndpointHealth:
    def __init__(self, options: HealthOptions | None = None, clock: Callable[[], float] = time.monotonic,
                 on_change: StateListener | None = None) -> None:
        self.options = options or HealthOptions()
        self.clock = clock
        self.on_change = on_change
        self._records: dict[str, EndpointRecord] = {}
        self._out = 0  # endpoints not healthy: the hot path skips all work while it is 0
        self._out_set: set[str] = set()  # ... and which they are, so a large fleet's check visits only them

    # ---- what the pipeline asks ----
    def eligible(self, endpoints: tuple[str, ...]) -> tuple[str, ...]:
        """The endpoints a decision may choose: healthy ones, probing ones with no probe in flight, and ejected
        ones whose backoff has elapsed (the first request routed there becomes the probe). At most
        `max_ejection_percent` of `endpoints` are left out: past that the ones due back soonest return.
        Empty when every one is out (the caller decides what failing open means). A pure query."""
        if not self._out:
            return endpoints
        now = self.clock()
        records = self._records
        out = frozenset(ep for ep in endpoints if not self._admits(records.get(ep), now))
        if not out:
            return endpoints
        left_out = self.capped(out, len(endpoints))
        return tuple(ep for ep in endpoints if ep not in left_out)

    def not_admitted(self) -> set[str]:
        """The endpoints `eligible` would leave out now, before the cap, visiting only those not healthy (a large
        fleet's decision asks this instead of filtering every endpoint, then `capped`: routing/pipeline.py)."""
        if not self._out:
            return set()
        now = self.clock()
        records = self._records
        return {ep for ep in list(self._out_set) if not self._admits(records.get(ep), now)}

    def capped(self, out: frozenset[str], candidates: int) -> frozenset[str]:
        """`out` within the cap of `candidates`: past it, the ones due back soonest are admitted again (an
        unreachable one last: it is not due until a scrape answers)."""
        limit = self._max_out(candidates)
        if len(out) <= limit:
            return out
        records = self._records

        def due(ep: str) -> tuple[bool, float, str]:
            record = records[ep]
            return record.unreachable, record.until, ep
        return frozenset(sorted(out, key=due)[len(out) - limit:])

    def _max_out(self, candidates: int) -> int:
        """Envoy's rule: at most this share of hosts ejected, but at least one host can be."""
        return max(1, int(candidates * self.options.max_ejection_percent / 100.0))

    @staticmethod
    def _admits(record: EndpointRecord | None, now: float) -> bool:
        if record is None or record.state == HEALTHY:
            return True
        if record.state == EJECTED and (record.unreachable or now < record.until):
            return False
        return record.probe is None

    # ---- the request lifecycle ----
    def on_decided(self, decision: Decision) -> None:
        endpoint = decision.endpoint
        if endpoint is None or not self._out:
            return
        record = self._records.get(endpoint)
        if record is None or record.state == HEALTHY:
            return
        if record.state == EJECTED and not record.unreachable and self.clock() >= record.until:
            self._set(endpoint, record, PROBING, record.reason)  # its backoff is over: this request probes
        if record.state == PROBING and record.probe is None:
            record.probe = decision

    def on_served(self, decision: Decision, previous: str | None) -> None:
        pass

    def on_ended(self, decision: Decision) -> None:
        if not self._out or decision.endpoint is None:
            return
        record = self._records.get(decision.endpoint)
        if record is not None and record.probe is decision:
            record.probe = None  # ended without an outcome: the slot is free for the next request

    def on_responded(self, decision: Decision, status: int) -> None:
        """The response headers arrived: `decision.served` answered `status`. Engines ranked before it were
        tried and failed (the proxy moves down the list only on a failure). Without the proxy's report of
        who served, the response is the proxy's own (no engine was reached): nothing is learned."""
        served = decision.served
        if served is None or not decision.served_reported:
            return
        ranked = decision.ranked
        passed = ranked[:ranked.index(served)] if served in ranked else ranked[:1]
        for endpoint in passed:
            self.failed(endpoint, PASSED_OVER)
        kind = upstream_failure(status)
        if kind is not None:
            self.failed(served, kind)
        elif status < 500:  # a 4xx is the client's problem; the engine answered
            self.succeeded(served)

    # ---- outcomes ----
    def succeeded(self, endpoint: str) -> None:
        record = self._records.get(endpoint)
        if record is None:
            record = self._records[endpoint] = EndpointRecord()
        record.successes += 1
        record.consecutive = 0
        if record.state != HEALTHY and not record.unreachable:
            record.ejections = 0
            record.probe = None
            self._set(endpoint, record, HEALTHY, "")

    def failed(self, endpoint: str, kind: str) -> None:
        record = self._records.get(endpoint)
        if record is None:
            record = self._records[endpoint] = EndpointRecord()
        record.failures[kind] = record.failures.get(kind, 0) + 1
        record.consecutive += 1
        threshold = self.options.failures_to_eject
        due = record.state == EJECTED and not record.unreachable and self.clock() >= record.until
        if threshold and (record.state == PROBING or due
                          or (record.state == HEALTHY and record.consecutive >= threshold)):
            self._eject(endpoint, record, kind)  # a failure once due for a probe is a failed probe

    def scrape_ok(self, endpoint: str) -> None:
        record = self._records.get(endpoint)
        if record is None:
            return
        record.scrape_failures = 0
        if record.unreachable:
            # Reachable again: probe it with one request (its requests may still fail; that decides).
            record.unreachable = False
            record.until = 0.0
            self._set(endpoint, record, PROBING, record.reason)

    def scrape_failed(self, endpoint: str) -> None:
        """A scrape timed out or could not connect (an HTTP error status does not count: the server is up)."""
        threshold = self.options.unreachable_after
        record = self._records.get(endpoint)
        if record is None:
            record = self._records[endpoint] = EndpointRecord()
        record.scrape_failures += 1
        if threshold and record.scrape_failures >= threshold and not record.unreachable:
            record.failures[UNREACHABLE] = record.failures.get(UNREACHABLE, 0) + 1
            record.unreachable = True
            record.probe = None
            self._set(endpoint, record, EJECTED, UNREACHABLE)

    def _eject(self, endpoint: str, record: EndpointRecord, kind: str) -> None:
        record.ejections += 1
        opts = self.options
        backoff = min(opts.max_ejection_s, opts.base_ejection_s * 2 ** (record.ejections - 1))
        record.until = self.clock() + backoff
        record.probe = None
        self._set(endpoint, record, EJECTED, kind)

    def _set(self, endpoint: str, record: EndpointRecord, state: str, reason: str) -> None:
        if record.state == state and record.reason == reason:
            return
        was_out = record.state != HEALTHY
        record.state, record.reason = state, reason
        self._out += (state != HEALTHY) - was_out
        if state != HEALTHY:
            self._out_set.add(endpoint)
        else:
            self._out_set.discard(endpoint)
        if self.on_change is not None:
            self.on_change(endpoint, state, reason)

    # ---- the fleet and the debug API ----
    def forget(self, endpoint: str) -> None:
        record = self._records.pop(endpoint, None)
        if record is not None and record.state != HEALTHY:
            self._out -= 1
        self._out_set.discard(endpoint)

    def state(self, endpoint: str) -> str:
        record = self._records.get(endpoint)
        if record is None:
            return HEALTHY
        if record.state == EJECTED and not record.unreachable and self.clock() >= record.until:
            return PROBING  # due for its probe: the next decision may take it
        return record.state

    def view(self, endpoint: str) -> HealthView:
        record = self._records.get(endpoint) or EndpointRecord()
        remaining = max(0.0, record.until - self.clock()) if record.state == EJECTED else 0.0
        return HealthView(self.state(endpoint), record.reason, record.consecutive, record.ejections,
                          round(remaining, 3), dict(record.failures), record.successes)
