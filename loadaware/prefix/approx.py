"""The approximate prefix source, for engines that publish neither LMCache nor KV events.

The sidecar remembers its own routing decisions: a request routed to engine E made E compute (and, with
prefix caching, keep) every full block of its prompt. Those block chains, per engine, are a GUESS at E's
prefix cache: the engine also evicts under memory pressure, serves traffic other routers sent, restarts.
So the guess is bounded by an LRU sized from the engine's KV capacity, and decays: a block not routed to
for `ttl_s` is dropped (the engine has probably evicted it). Every metric of this source says
"approx" in its name, and `loadaware_prefix_source_info{exact="false"}` marks it.

`ApproxIndex` is pure (the caller passes the time), so a discrete-event experiment can use it directly.
Without a tokenizer the units are the prompt's UTF-8 bytes in groups of 4 (`TextUnits`, about a token each),
in blocks of 16 units as with tokens: prompt lengths stay comparable with KV capacities in tokens.

Guesses are keyed by the request's `cache_salt` as the engine keys its blocks (blocks.block_keys): what a
salted request was routed with credits only later requests with the same salt, and never an unsalted one.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from loadaware.fleet.members import member_set
from loadaware.lifecycle import Decision, previewing
from loadaware.prefix.blocks import SlotTable, block_keys, chain_keys, unhold
from loadaware.prefix.source import salt_of
from loadaware.telemetry.metrics import Metrics

# Rough CPython cost of one guessed block: an owner-map entry, its slot in its run + an inverted-map entry.
BYTES_PER_APPROX_BLOCK = 200


def prefix_walk(holders: dict[int, int], names: dict[int, str], alive: int, keys: Sequence[int],
                block_size: int) -> dict[str, int]:
    """blocks.walk's answer where every engine's blocks are prefix-closed (as the approximate index's are): an
    engine holding a chain's block holds every block before it, so the engines still in the race at block j
    are those of `alive` holding block j, and each engine's end is found by bisection. Work: a bisection per
    distinct end among the engines, not a step per block."""
    out: dict[str, int] = {}
    n, lo, current = len(keys), 0, alive
    while current:
        left, right = lo, n  # the first block from lo that some engine of `current` lacks (n: none)
        while left < right:
            mid = (left + right) // 2
            if holders.get(keys[mid], 0) & current == current:
                left = mid + 1
            else:
                right = mid
        held = holders.get(keys[left], 0) & current if left < n else 0
        lost, matched = current ^ held, left * block_size
        while lost and (matched or left == n):  # as walk: a chain's end credits even an empty chain's holders
            low = lost & -lost
            out[names[low.bit_length() - 1]] = matched
            lost ^= low
        current, lo = held, left + 1
    return out


class _Run:
    """Consecutive blocks of one chain that one engine was last routed at the same moment (`at`): their keys in
    chain order from chain position `start`; `parent` is the key of the block before (None: the chain's first).
    Runs sit in their engine's list least recently routed first (`prev`, `next`); a run in no list points at
    DETACHED, never at itself: a run that left its list is then no reference cycle and is freed at once. (A cycle
    waits for the cyclic collector, and one frozen out of it by a slow collection, loadaware/collector.py, is never
    freed: every run evicted after such a freeze was kept, the soak's steady growth.)"""

    __slots__ = ("at", "keys", "next", "parent", "prev", "start")

    def __init__(self, keys: list[int], start: int, parent: int | None, at: float) -> None:
        self.keys = keys
        self.start = start
        self.parent = parent
        self.at = at
        self.prev: _Run = DETACHED
        self.next: _Run = DETACHED


def _detached() -> _Run:
    """What a run in no list points at: linked to itself, so that unlinking a detached run writes only here."""
    run = _Run.__new__(_Run)
    run.keys, run.start, run.parent, run.at = [], 0, None, 0.0
    run.prev = run.next = run
    return run


DETACHED = _detached()


class _Guess:
    """One engine's guessed blocks, in runs (see ApproxIndex). `owner`: each block's run; `attached`: how many
    runs continue right after a block (the block ends a run, and another chain, or the rest of a split run, goes
    on from there)."""

    __slots__ = ("attached", "bit", "owner", "runs")

    def __init__(self, bit: int) -> None:
        self.bit = bit
        self.owner: dict[int, _Run] = {}
        self.attached: dict[int, int] = {}
        self.runs = _Run([], 0, None, 0.0)  # the list's sentinel: runs.next is the least recently routed
        self.runs.prev = self.runs.next = self.runs  # (the one cycle: the list, broken by clear())

    def held(self, keys: Sequence[int]) -> int:
        """How many of the chain's first blocks this engine holds. What an engine holds is prefix-closed (each
        record touches a chain's head with its tail, evictions take tails first), so a bisection finds it."""
        owner = self.owner
        if not keys or keys[0] not in owner:
            return 0
        lo, hi = 1, len(keys)  # keys[:lo] held; keys[hi - 1] held only if hi == len(keys) is
        if keys[hi - 1] in owner:
            return hi
        hi -= 1
        while lo < hi:  # keys[lo - 1] held, keys[hi] not
            mid = (lo + hi) // 2
            if keys[mid] in owner:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def link_last(self, run: _Run) -> None:
        """Make `run` the most recently routed (unlinking it first if linked)."""
        run.prev.next, run.next.prev = run.next, run.prev
        sentinel = self.runs
        run.prev, run.next = sentinel.prev, sentinel
        sentinel.prev.next = run
        sentinel.prev = run

    def unlink(self, run: _Run) -> None:
        run.prev.next, run.next.prev = run.next, run.prev
        run.prev = run.next = DETACHED
        if run.parent is not None:
            self.detach(run.parent)

    def clear(self) -> None:
        """Unlink every run (the guess is dropped): its list is no reference cycle left for the collector."""
        sentinel = self.runs
        run = sentinel.next
        while run is not sentinel:
            run.prev, run.next, run = DETACHED, DETACHED, run.next
        sentinel.prev = sentinel.next = DETACHED

    def attach(self, key: int) -> None:
        self.attached[key] = self.attached.get(key, 0) + 1

    def detach(self, key: int) -> None:
        left = self.attached.pop(key, 1) - 1
        if left:
            self.attached[key] = left

    def split(self, run: _Run, last: int) -> None:
        """Cut `run` after its block `last`: the rest becomes a run of its own, keeping the run's place and time."""
        if last >= len(run.keys) - 1:
            return
        rest = run.keys[last + 1:]
        del run.keys[last + 1:]
        cut = _Run(rest, run.start + last + 1, run.keys[last], run.at)
        self.owner.update(dict.fromkeys(rest, cut))
        self.attach(run.keys[last])
        cut.prev, cut.next = run.prev, run  # just before the run: the same recency
        run.prev.next = cut
        run.prev = cut


class ApproxIndex:
    """`capacity_blocks` bounds each engine's guess; `max_blocks` the sum over engines, so the memory bound
    does not grow with the fleet. An engine recorded past either bound loses its own oldest blocks.

    Each engine's guess is least recently routed first, block by block, a record touching its chain tail first.
    A block is touched whenever a later block of its chain is, so what an engine holds is prefix-closed and its
    order is kept in runs: consecutive blocks of a chain touched last by the same record, the runs in recency
    order, a run's blocks evicted from its tail. A record costs its new blocks, the runs its held head passes
    through (a run it passes only in part is split) and what it evicts; the order of evictions and decay is
    the order a per-block list would have."""

    def __init__(self, capacity_blocks: int, block_size: int, ttl_s: float, max_blocks: int | None = None) -> None:
        if capacity_blocks < 1 or block_size < 1 or ttl_s <= 0 or (max_blocks is not None and max_blocks < 1):
            raise ValueError("capacity_blocks, block_size, ttl_s and max_blocks must be positive")
        self.capacity_blocks = capacity_blocks
        self.max_blocks = max_blocks  # None: no bound on the sum (a simulation with a fixed fleet)
        self.total_blocks = 0
        self.block_size = block_size
        self.ttl_s = ttl_s
        self._holders: dict[int, int] = {}
        self._engines: dict[str, _Guess] = {}
        self._slots = SlotTable()
        self.evicted = {"capacity": 0, "decay": 0, "endpoint_removed": 0}

    def keys(self, tokens: Sequence[int], salt: str | None = None) -> list[int]:
        if len(tokens) // self.block_size <= self.capacity_blocks:  # the whole chain: shared with other indexes
            return chain_keys(tokens, self.block_size, salt)
        return block_keys(tokens, self.block_size, limit=self.capacity_blocks, salt=salt)

    def record(self, engine: str, keys: Sequence[int], now: float) -> int:
        """The request with these block keys was routed to `engine`; returns blocks evicted for capacity."""
        guess = self._engines.get(engine)
        if guess is None:
            guess = self._engines[engine] = _Guess(self._slots.bit(engine))
        held = guess.held(keys)
        new = list(keys[held:])
        self._touch(guess, keys, held, new, now)
        holders, bit = self._holders, guess.bit
        if any(map(holders.__contains__, new)):
            for key in new:
                holders[key] = holders.get(key, 0) | bit
        else:  # no other engine holds any of them (a prompt new to the fleet): one update in C
            holders.update(dict.fromkeys(new, bit))
        total = self.total_blocks + len(new)
        excess = len(guess.owner) - self.capacity_blocks
        if self.max_blocks is not None:
            excess = max(excess, total - self.max_blocks)
        evicted = self._evict(guess, excess) if excess > 0 else 0
        # One store, after the eviction: /debug/state reads the total from its render thread meanwhile.
        self.total_blocks = total - evicted
        self.evicted["capacity"] += evicted
        return evicted

    @staticmethod
    def _touch(guess: _Guess, keys: Sequence[int], held: int, new: list[int], now: float) -> None:
        """Make the chain's `held` head and its `new` blocks the engine's most recently routed, the head last (an
        engine evicts a sequence's tail before its head, as vLLM frees blocks in reverse; a walk stops at the
        first miss anyway). Runs the chain passes only partly are split; new blocks extend the head's last run
        when nothing else goes on from it. Work: the new blocks plus the runs the head passes through."""
        owner = guess.owner
        path: list[_Run] = []
        if held:
            run = owner[keys[held - 1]]
            guess.split(run, held - 1 - run.start)
            if new and not guess.attached.get(run.keys[-1]):  # the chain goes on where this run ends
                run.keys.extend(new)
                owner.update(dict.fromkeys(new, run))
                new = []
            path.append(run)
            while run.parent is not None:
                up = owner[run.parent]
                guess.split(up, run.start - 1 - up.start)
                path.append(up)
                run = up
        if new:
            leaf = _Run(new, held, keys[held - 1] if held else None, now)
            owner.update(dict.fromkeys(new, leaf))
            if leaf.parent is not None:
                guess.attach(leaf.parent)
            path.insert(0, leaf)
        for run in path:  # leaf first: the chain's head ends up most recent
            run.at = now
            guess.link_last(run)

    def _evict(self, guess: _Guess, count: int) -> int:
        """Drop the engine's `count` least recently routed blocks (fewer if it holds fewer), tails first; the
        caller takes them off the total."""
        holders, owner, bit, sentinel = self._holders, guess.owner, guess.bit, guess.runs
        done = 0
        while done < count and sentinel.next is not sentinel:
            run = sentinel.next  # no run goes on from this one: those would have been routed less recently
            take = min(count - done, len(run.keys))
            victims = run.keys[len(run.keys) - take:]
            del run.keys[len(run.keys) - take:]
            deque(map(owner.__delitem__, victims), maxlen=0)
            if list(map(holders.get, victims)).count(bit) == take:  # held here alone: removed in C
                deque(map(holders.__delitem__, victims), maxlen=0)
            else:
                for key in victims:
                    unhold(holders, key, bit)
            if not run.keys:
                guess.unlink(run)
            done += take
        return done

    def expire(self, now: float) -> int:
        """Forget guesses older than ttl_s; returns how many."""
        horizon = now - self.ttl_s
        dropped = 0
        for guess in self._engines.values():
            sentinel = guess.runs
            while sentinel.next is not sentinel and sentinel.next.at < horizon:
                run = sentinel.next
                for key in run.keys:
                    del guess.owner[key]
                    unhold(self._holders, key, guess.bit)
                dropped += len(run.keys)
                run.keys = []
                guess.unlink(run)
        self.total_blocks -= dropped
        self.evicted["decay"] += dropped
        return dropped

    def drop(self, engine: str) -> int:
        guess = self._engines.pop(engine, None)
        if guess is None:
            return 0
        for key in guess.owner:
            unhold(self._holders, key, guess.bit)
        guess.clear()
        self._slots.release(engine)
        self.total_blocks -= len(guess.owner)
        self.evicted["endpoint_removed"] += len(guess.owner)
        return len(guess.owner)

    def match(self, keys: Sequence[int], endpoints: Sequence[str]) -> dict[str, int]:
        engines = self._engines
        if len(engines) < len(endpoints):
            # Fewer guessed engines than endpoints asked about (a large fleet): walk them all and keep the
            # asked ones. Each engine's match is its own, so the others' presence changes nothing.
            if not keys:
                return {}
            members = member_set(endpoints)
            found = prefix_walk(self._holders, self._slots.names, self._slots.every_bit(), keys, self.block_size)
            return {ep: n for ep, n in found.items() if ep in members}
        alive = 0
        for name in endpoints:
            guess = engines.get(name)
            if guess is not None and guess.owner:
                alive |= guess.bit
        return prefix_walk(self._holders, self._slots.names, alive, keys, self.block_size)

    def blocks(self, engine: str) -> int:
        guess = self._engines.get(engine)
        return 0 if guess is None else len(guess.owner)

    def engines(self) -> list[str]:
        return list(self._engines)

    def approx_bytes(self) -> int:
        return self.total_blocks * BYTES_PER_APPROX_BLOCK


class ApproxPrefixSource:
    """Credits engines with what the sidecar itself routed to them. Approximate: see the module notes."""

    name = "approx"
    exact = False

    def __init__(self, index: ApproxIndex, metrics: Metrics, clock: Any = time.monotonic) -> None:
        self.index = index
        self.metrics = metrics
        self.clock = clock
        # The decision that follows a lookup routes the same token list: keep its keys and answer.
        self._last_tokens: Sequence[int] | None = None
        self._last_salt: str | None = None
        self._last_keys: list[int] = []
        self._last_answer: dict[str, int] = {}

    def _keys(self, tokens: Sequence[int], salt: str | None) -> list[int]:
        salt = salt_of(tokens, salt)
        if tokens is not self._last_tokens or salt != self._last_salt:
            self._last_tokens = tokens
            self._last_salt = salt
            self._last_keys = self.index.keys(tokens, salt)
            self._last_answer = {}
        return self._last_keys

    def lookup(self, tokens: Sequence[int], endpoints: Sequence[str], salt: str | None = None) -> dict[str, int]:
        if previewing():  # Explain: the same answer, and the memo of the last lookup left as it was
            return self.index.match(self.index.keys(tokens, salt_of(tokens, salt)), endpoints)
        answer = self.index.match(self._keys(tokens, salt), endpoints)
        self._last_answer = answer
        return answer

    async def matches(self, tokens: Sequence[int], endpoints: tuple[str, ...],
                      salt: str | None = None) -> dict[str, int]:
        return self.lookup(tokens, endpoints, salt)

    # ---- the request lifecycle: the guess is made of what the sidecar routed ----
    # A decision's token ids carry the request's salt (source.PromptTokens), so its guess lands under it.
    def on_decided(self, decision: Decision) -> None:
        if decision.tokens and decision.endpoint is not None:
            # The keys, not the token ids, kept for the request's life: the decision drops its ids once announced.
            decision.approx = self.routed(decision.tokens, decision.endpoint)

    def on_served(self, decision: Decision, previous: str | None) -> None:
        """Another engine served (a retry walked the ranked list): it computed the prompt's blocks too."""
        if decision.approx and decision.served is not None:
            self._record(decision.approx, decision.served, credited=0)

    def on_ended(self, decision: Decision) -> None:
        pass

    def routed(self, tokens: Sequence[int], endpoint: str, salt: str | None = None) -> list[int]:
        """A request with these prompt tokens (and cache salt) went to `endpoint`: remember its blocks there.
        Returns their keys."""
        keys = self._keys(tokens, salt)
        self._record(keys, endpoint, self._last_answer.get(endpoint, 0))
        return keys

    def _record(self, keys: Sequence[int], endpoint: str, credited: int) -> None:
        if credited:
            self.metrics.approx_credited.inc(credited)
        evicted = self.index.record(endpoint, keys, self.clock())
        if evicted:
            self.metrics.approx_evictions.labels("capacity").inc(evicted)

    def drop(self, endpoint: str) -> None:
        dropped = self.index.drop(endpoint)
        if dropped:
            self.metrics.approx_evictions.labels("endpoint_removed").inc(dropped)

    def expire(self) -> None:
        dropped = self.index.expire(self.clock())
        if dropped:
            self.metrics.approx_evictions.labels("decay").inc(dropped)

    def refresh_gauges(self) -> None:
        for endpoint in self.index.engines():
            self.metrics.approx_blocks.labels(endpoint).set(self.index.blocks(endpoint))
        self.metrics.approx_bytes.set(self.index.approx_bytes())

    def state(self) -> dict[str, object]:
        return {"exact": False, "block_size": self.index.block_size, "capacity_blocks": self.index.capacity_blocks,
                "max_blocks": self.index.max_blocks, "total_blocks": self.index.total_blocks,
                "ttl_s": self.index.ttl_s, "engines": {ep: self.index.blocks(ep) for ep in self.index.engines()},
                "approx_bytes": self.index.approx_bytes(), "evicted": dict(self.index.evicted)}

    async def run(self, period_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(period_s)
            self.expire()
