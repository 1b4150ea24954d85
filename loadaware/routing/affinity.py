"""Session affinity: a request carrying a session key goes back to the endpoint that served its session.

Opt-in (`--session-header NAME`: the request header whose value is the key). The rule, applied by the decision
pipeline (routing/pipeline.py) with the bindings kept here:

    sticky(s)    = the endpoint session s was last bound to, if s was used within --session-ttl-s
    route(s)     = sticky(s)          if it is one of this decision's candidates and not saturated(sticky(s))
                   the policy's choice otherwise
    saturated(e) = load(e) + 1 > cap                      cap: the pile-up guard's (policies/bounded.py)
                   or waiting(e) > 0 while some other candidate's waiting is 0

A candidate is in the request's model pool and in the proxy's subset, and not out of rotation for failing:
an endpoint that left the fleet, or is ejected, is simply not among them (so nothing needs to be told when an
endpoint leaves; its bindings age out). `waiting` is the engine's scraped `vllm:num_requests_waiting` (0
without a fresh scrape). The policy's ranking supplies the fallbacks after the sticky endpoint. Every counted
decision (re)binds the session to the endpoint it named first, and a response served by another engine (the
proxy's retries walked the ranked list) moves the binding there: the session follows its requests. Previews
(Explain) read the bindings and never change them.

Bounds: at most `max_entries` sessions; past that the least recently used is forgotten. A session idle for
`ttl_s` is forgotten lazily: a lookup ignores it, and each binding drops a few expired ones from the cold end
of the LRU. O(1) per request. Memory per entry, as a rule: the key string (at most 128 characters, the header
reader's bound), a 2-tuple and a float, and one slot and link of an ordered dict; the endpoint string is the
registry's, shared, not copied.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from loadaware.policies.base import Candidate

if TYPE_CHECKING:
    from loadaware.lifecycle import Decision

# Expired entries a binding drops from the cold end at most: keeps each request O(1) even after a long lull
# left the whole map expired (the entry count bound still holds, and lookups ignore what is left).
EXPIRED_DROPPED_PER_BINDING = 4
DEFAULT_MAX_ENTRIES = 100_000  # --session-max-entries' default (config.py); memory_budget.py counts it


class SessionAffinity:
    """Session key -> (endpoint, last used), an LRU bounded by entries, idle entries expiring after `ttl_s`.

    Also a lifecycle listener (subscribed by the decider): when the proxy reports that another engine served a
    request, the request's session follows it."""

    __slots__ = ("_entries", "clock", "max_entries", "ttl_s")

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, ttl_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1 or ttl_s <= 0:
            raise ValueError("session affinity needs max_entries >= 1 and ttl_s > 0")
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.clock = clock
        # Ordered by last binding, oldest first: the cold end is both the LRU victim and the likeliest expired.
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def sticky(self, session: str, now: float) -> str | None:
        """The endpoint `session` is bound to, None when unbound or idle past the TTL. Reads only: a preview may
        call it."""
        entry = self._entries.get(session)
        if entry is None or now - entry[1] > self.ttl_s:
            return None
        return entry[0]

    def remember(self, session: str, endpoint: str, now: float) -> None:
        """Bind `session` to `endpoint` as of `now` (most recently used), then enforce the bounds."""
        entries = self._entries
        entries[session] = (endpoint, now)
        entries.move_to_end(session)
        while len(entries) > self.max_entries:
            entries.popitem(last=False)
        for _ in range(EXPIRED_DROPPED_PER_BINDING):
            oldest = next(iter(entries.values()))
            if now - oldest[1] <= self.ttl_s:
                break
            entries.popitem(last=False)

    def follow(self, session: str, previous: str | None, endpoint: str, now: float) -> None:
        """Another engine served a request of `session`: rebind it there, unless a later decision already
        bound the session elsewhere (then that binding is the newer fact)."""
        entry = self._entries.get(session)
        if entry is not None and entry[0] == previous:
            self.remember(session, endpoint, now)

    # ---- lifecycle listener (loadaware.lifecycle.LifecycleListener) ----
    def on_decided(self, decision: Decision) -> None:
        pass  # the decider binds as it decides (counted decisions only)

    def on_served(self, decision: Decision, previous: str | None) -> None:
        if decision.session and decision.served is not None:
            self.follow(decision.session, previous, decision.served, self.clock())

    def on_ended(self, decision: Decision) -> None:
        pass  # a session outlives its requests; it expires by the TTL


def saturated(sticky: Candidate, candidates: Sequence[Candidate], cap: int | None,
              waiting: Callable[[Candidate], float]) -> bool:
    """The module docstring's `saturated`: past the pile-up guard's cap (None: the pool is not bounded), or
    queueing while another candidate does not."""
    if cap is not None and sticky.load + 1 > cap:
        return True
    if waiting(sticky) > 0:
        return any(c is not sticky and waiting(c) <= 0 for c in candidates)
    return False
