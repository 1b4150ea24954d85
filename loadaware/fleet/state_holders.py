"""Which engine holds each stored response (the Responses API's state), so a follow-up reaches it.

vLLM keeps a stored response, its input messages and its events in a dict of the engine process that made it
(`VLLM_ENABLE_RESPONSES_API_STORE=1`; never evicted there): a follow-up naming `previous_response_id`, a
`GET /v1/responses/{id}` or a cancel on any other engine answers 404. The sidecar learns the holder from the
response itself (extproc reads the id from the body of the requests that may store one) and keeps it here:

- a bounded map id -> endpoint: at most `max_entries` (least recently used dropped first), each for `ttl_s` after
  it was learned or last used (docs/memory.md gives the bytes per entry);
- for an id it does not know (another gateway replica made it, or this sidecar restarted), it asks the engines
  (`GET /v1/responses/{id}` on each, at once, within `probe_timeout_s`): the first that answers 200 holds it.
  The answer is remembered, and an id nobody holds is remembered as such for `miss_ttl_s` (so a burst of
  follow-ups for a lost response asks once). Concurrent lookups of one id share one probe, and at most
  MAX_PROBING ids are asked about at once (past it an unknown id is routed as any request: a client naming
  random ids cannot turn each request into a GET to every engine).

A holder that is gone (left the fleet) is forgotten, and the engines are asked again: whoever answers holds it,
else the request is routed as any other and the engine answers its own 404 (never a silent retry elsewhere).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from loadaware.lifecycle import previewing

Probe = Callable[[str, str], Awaitable[bool]]  # (endpoint, response id) -> holds it; raises when it cannot tell
Clock = Callable[[], float]

DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_TTL_S = 24 * 3600.0
DEFAULT_PROBE_TIMEOUT_S = 0.5
MISS_TTL_S = 2.0
MAX_MISSES = 4096
# Ids being asked about at once: a client that names unknown ids at a high rate would otherwise make every one of
# its requests a GET to every engine. Past it, an unknown id is routed as any request (PROBE_BUSY).
MAX_PROBING = 64

# How a stateful request was placed (Decision.state, the loadaware_state_placements_total label).
KNOWN = "known"  # the holder was learned from its response
PROBED = "probed"  # the engines were asked and one holds it
NOT_FOUND = "not_found"  # every engine asked answered that it does not hold it: routed as any request
PROBE_FAILED = "probe_failed"  # no engine could tell in time: routed as any request
PROBE_BUSY = "probe_busy"  # MAX_PROBING ids were being asked about already: routed as any request
NO_LOCATOR = "no_locator"


class StateHolders:
    def __init__(self, probe: Probe | None = None, max_entries: int = DEFAULT_MAX_ENTRIES,
                 ttl_s: float = DEFAULT_TTL_S, probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
                 clock: Clock = time.monotonic) -> None:
        self.probe = probe
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.probe_timeout_s = probe_timeout_s
        self._clock = clock
        self._holders: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (endpoint, expiry)
        self._misses: OrderedDict[str, float] = OrderedDict()  # id -> expiry of "nobody holds it"
        self._probing: dict[str, asyncio.Future[tuple[str | None, str]]] = {}
        self.learned = 0
        self.probes = 0

    def __len__(self) -> int:
        return len(self._holders)

    def learn(self, response_id: str, endpoint: str) -> None:
        """`endpoint` made the response `response_id` (read from its body)."""
        if not response_id or not endpoint or self.max_entries <= 0:
            return
        self._holders[response_id] = (endpoint, self._clock() + self.ttl_s)
        self._holders.move_to_end(response_id)
        self._misses.pop(response_id, None)
        self.learned += 1
        while len(self._holders) > self.max_entries:
            self._holders.popitem(last=False)

    def known(self, response_id: str) -> str | None:
        """The learned holder, while its entry lives (a use keeps it for another ttl)."""
        entry = self._holders.get(response_id)
        if entry is None:
            return None
        now = self._clock()
        if entry[1] <= now:
            if not previewing():
                del self._holders[response_id]
            return None
        if previewing():  # Explain reads, never changes
            return entry[0]
        self._holders[response_id] = (entry[0], now + self.ttl_s)
        self._holders.move_to_end(response_id)
        return entry[0]

    def _remember_miss(self, response_id: str) -> None:
        """Nobody holds `response_id`, for MISS_TTL_S. The map is in expiry order (a repeat moves to the end), so
        the expired misses are dropped from its front: it holds the last MISS_TTL_S of misses, not the last
        MAX_MISSES whatever their age (docs/memory.md, "What Python kept, named")."""
        now = self._clock()
        misses = self._misses
        misses.pop(response_id, None)
        misses[response_id] = now + MISS_TTL_S
        while misses and (len(misses) > MAX_MISSES or next(iter(misses.values())) <= now):
            misses.popitem(last=False)

    async def locate(self, response_id: str, fleet: tuple[str, ...]) -> tuple[str | None, str]:
        """(the holder in `fleet`, how it was found) or (None, why not). Never raises but for cancellation."""
        holder = self.known(response_id)
        if holder is not None:
            if holder in fleet:
                return holder, KNOWN
            if not previewing():
                del self._holders[response_id]  # the holder left the fleet: ask who holds it now
        if self.probe is None or not fleet:
            return None, NO_LOCATOR if self.probe is None else NOT_FOUND
        miss = self._misses.get(response_id)
        if miss is not None and miss > self._clock():
            return None, NOT_FOUND
        pending = self._probing.get(response_id)
        if pending is not None:
            return await asyncio.shield(pending)
        if len(self._probing) >= MAX_PROBING:
            return None, PROBE_BUSY
        future: asyncio.Future[tuple[str | None, str]] = asyncio.get_running_loop().create_future()
        self._probing[response_id] = future
        try:
            found = await self._ask(response_id, fleet)
            future.set_result(found)
            return found
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        finally:
            del self._probing[response_id]

    async def _ask(self, response_id: str, fleet: tuple[str, ...]) -> tuple[str | None, str]:
        """Every engine at once; the first that holds it wins and the others are cancelled."""
        probe = self.probe
        assert probe is not None
        self.probes += 1
        tasks = {asyncio.ensure_future(probe(ep, response_id)): ep for ep in fleet}
        for task in tasks:
            task.add_done_callback(_retrieved)  # the ones left behind end with no one awaiting them
        undecided = False
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                for done in asyncio.as_completed(tasks):
                    try:
                        holds = await done
                    except Exception:  # noqa: BLE001 - an engine that cannot tell: the others may
                        undecided = True
                        continue
                    if holds:
                        winner = next(ep for t, ep in tasks.items() if t.done() and not t.cancelled()
                                      and t.exception() is None and t.result())
                        if not previewing():
                            self.learn(response_id, winner)
                        return winner, PROBED
        except TimeoutError:
            return None, PROBE_FAILED
        finally:
            for task in tasks:
                task.cancel()
        if undecided:
            return None, PROBE_FAILED
        if previewing():
            return None, NOT_FOUND
        self._remember_miss(response_id)
        return None, NOT_FOUND


def _retrieved(task: asyncio.Future[bool]) -> None:
    if not task.cancelled():
        task.exception()
