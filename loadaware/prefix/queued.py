"""Prompts waiting in an engine's admission queue: prefix credit that no exact source can show yet.

An exact source (KV events, LMCache) learns of a prompt's blocks once the engine has computed them. A request
routed to an engine that queues (vllm:num_requests_waiting > 0) waits seconds for a slot, and every request
sent there before it is prefilled first, so its prompt's blocks are in that engine's cache by the time this
one is scheduled. Until then the exact source shows the engine as not holding them: a second request for a new
or evicted prefix looks cold everywhere, is placed by load alone, and computes the prefix again on another
engine, whose copy evicts some other prefix. On a fleet that queues for long (the placement grid's overload
point: ~14 s) that happened to ~1 request in 15, and a saturated fleet's queue grows with every prefill it
repeats (research/notebook.md).

So the sidecar remembers the prompts it routed to an engine that had an admission queue, until they end
(`QueuedPrefixes`, a lifecycle listener), and a decision credits such an engine, while it still queues, with
the longest prefix of the prompt that one of those requests holds: matched = max(exact match, queued match)
(`credit`). Only while the engine queues: a request that is admitted at once is prefilled beside the earlier
one, not after it, and finds none of its blocks (the grid's long-prefix point, credited without that
condition, lost 15x on TTFT p95).

Keys are the exact sources' chained block keys (blocks.block_keys, 16-token blocks, salted as vLLM salts), every
STRIDE-th of them: a key chains on every block before it, so the credit never extends past the first block the
two prompts do not share, and falls short of the shared part by less than STRIDE blocks (< 64 tokens, ~15 ms
of prefill at the calibrated engine's rate, where the queue this credit is for waits seconds). Holding and
releasing every key cost ~26 µs a request; every 4th, a quarter of that.

Cost: nothing while no candidate queues; then the prompt's key chain (shared with the KV-events lookup of the
same decision, else ~40 µs for a 1,578-token prompt), a walk, and a refcount per block held and released
(python -m research.probes.queued_cost). Bounded: `max_blocks` (engine, block) entries
in all; past it a routed prompt is not remembered (less credit, never more).
"""

from __future__ import annotations

from collections.abc import Sequence

from loadaware.lifecycle import Decision
from loadaware.policies.base import Candidate
from loadaware.prefix.blocks import DEFAULT_BLOCK_SIZE, SlotTable, chain_keys, unhold, walk
from loadaware.prefix.source import salt_of

STRIDE = 4  # block keys per held key
DEFAULT_MAX_BLOCKS = 131_072  # (engine, key) entries: ~5,000 queued 1.5k-token prompts with distinct prefixes
# One (engine, key) entry: a refcount dict slot and its share of the inverted map and of the receipts; tracemalloc
# measured 85-102 B (tests/unit/test_memory_costs.py, docs/memory.md).
BYTES_PER_QUEUED_BLOCK = 130


class _Held:
    __slots__ = ("bit", "name", "refs")

    def __init__(self, name: str, bit: int) -> None:
        self.name = name
        self.bit = bit
        self.refs: dict[int, int] = {}  # block key -> requests holding it here


class Receipt:
    """What one routed request holds, to give back when it ends (or is served elsewhere)."""

    __slots__ = ("engine", "keys")

    def __init__(self, engine: _Held, keys: Sequence[int]) -> None:
        self.engine = engine
        self.keys = keys


def sampled(keys: Sequence[int], stride: int = STRIDE) -> Sequence[int]:
    """Every stride-th key of a prompt's chain: the key of blocks 0..stride-1, of 0..2 x stride-1, ..."""
    return keys[stride - 1::stride]


class QueuedIndex:
    """Refcounted keys per engine plus an inverted key -> engines map (blocks.walk reads it). Pure. Each key
    stands for `unit_tokens` prompt tokens (STRIDE blocks of 16 tokens: `sampled` picks them)."""

    def __init__(self, unit_tokens: int = STRIDE * DEFAULT_BLOCK_SIZE, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if unit_tokens < 1 or max_blocks < 1:
            raise ValueError("unit_tokens and max_blocks must be >= 1")
        self.unit_tokens = unit_tokens
        self.max_blocks = max_blocks
        self.total_blocks = 0
        self.skipped = 0  # holds refused at the bound
        self._holders: dict[int, int] = {}
        self._engines: dict[str, _Held] = {}
        self._slots = SlotTable()

    def __bool__(self) -> bool:
        return self.total_blocks > 0

    def hold(self, engine: str, keys: Sequence[int]) -> Receipt | None:
        """A request with these block keys was routed to `engine` while it queued. None: not held (no keys,
        or the bound is reached)."""
        if not keys:
            return None
        held = self._engines.get(engine)
        if held is None:
            held = self._engines[engine] = _Held(engine, self._slots.bit(engine))
        refs = held.refs
        new = sum(1 for k in keys if k not in refs)
        if self.total_blocks + new > self.max_blocks:
            self.skipped += 1
            if not refs:
                self._forget(held)
            return None
        holders, bit = self._holders, held.bit
        for k in keys:
            n = refs.get(k, 0)
            if not n:
                holders[k] = holders.get(k, 0) | bit
            refs[k] = n + 1
        self.total_blocks += new
        return Receipt(held, keys)

    def release(self, receipt: Receipt) -> None:
        held = receipt.engine
        if self._engines.get(held.name) is not held:  # the endpoint left (and maybe came back) meanwhile
            return
        refs, holders, bit = held.refs, self._holders, held.bit
        gone = 0
        for k in receipt.keys:
            n = refs.get(k, 0) - 1
            if n > 0:
                refs[k] = n
            elif n == 0:
                del refs[k]
                unhold(holders, k, bit)
                gone += 1
        self.total_blocks -= gone
        if not refs:
            self._forget(held)

    def drop(self, engine: str) -> None:
        """The endpoint left the fleet: forget what it holds (its requests' receipts become no-ops)."""
        held = self._engines.get(engine)
        if held is None:
            return
        for k in held.refs:
            unhold(self._holders, k, held.bit)
        self.total_blocks -= len(held.refs)
        held.refs = {}
        self._forget(held)

    def _forget(self, held: _Held) -> None:
        del self._engines[held.name]
        self._slots.release(held.name)

    def match(self, keys: Sequence[int], endpoints: Sequence[str]) -> dict[str, int]:
        """Matched tokens per endpoint (of `endpoints`) holding the prompt's first block(s)."""
        alive = 0
        engines = self._engines
        for ep in endpoints:
            held = engines.get(ep)
            if held is not None:
                alive |= held.bit
        return walk(self._holders, self._slots.names, alive, keys, self.unit_tokens) if alive else {}

    def engines(self) -> list[str]:
        """The engines some queued request is held on: the only ones a credit can reach."""
        return list(self._engines)

    def blocks(self) -> dict[str, int]:
        # A copy first: /debug/state renders off the event loop, which may add or drop an engine meanwhile.
        return {name: len(held.refs) for name, held in list(self._engines.items())}

    def approx_bytes(self) -> int:
        return self.total_blocks * BYTES_PER_QUEUED_BLOCK


def credit(candidates: Sequence[Candidate], index: QueuedIndex, keys: Sequence[int], prompt_tokens: int) -> int:
    """Raise each queueing candidate's matched tokens to what the requests queued there hold of the prompt;
    the part added goes to its `queued_tokens`. Returns the tokens credited in all. Pure."""
    queueing = [c.endpoint for c in candidates if c.waiting > 0]
    if not queueing or not keys:
        return 0
    found = index.match(keys, queueing)
    added = 0
    if found:
        for c in candidates:
            n = found.get(c.endpoint)
            if n is not None:
                n = min(n, prompt_tokens)
                if n > c.matched_tokens:
                    extra = n - c.matched_tokens
                    c.queued_tokens = float(extra)
                    added += extra
                    c.matched_tokens = n
    return added


def queued_choice(decision: Decision) -> bool:
    """Was the decision's engine queueing when the decision scored it?"""
    ep = decision.endpoint
    for c in decision.candidates:
        if c.endpoint == ep:
            return c.waiting > 0
    return False


class QueuedPrefixes:
    """The sidecar's side: keys shared between a decision's credit and its hold, and the request lifecycle
    (decided: hold while the chosen engine queues; served elsewhere or ended: release)."""

    def __init__(self, index: QueuedIndex | None = None) -> None:
        self.index = index if index is not None else QueuedIndex()
        self.credited_tokens = 0

    def keys(self, tokens: Sequence[int]) -> Sequence[int]:
        """The prompt's sampled chain; the chain is computed once per decision, shared with the KV-events or
        approximate lookup (blocks.chain_keys)."""
        return sampled(chain_keys(tokens, DEFAULT_BLOCK_SIZE, salt_of(tokens)))

    def credit(self, candidates: Sequence[Candidate], tokens: Sequence[int], count: bool) -> None:
        """The pipeline's step, before the policy chooses (`count` False: Explain, which changes nothing)."""
        if not self.index or not any(c.waiting > 0 for c in candidates):
            return
        added = credit(candidates, self.index, self.keys(tokens), len(tokens))
        if count:
            self.credited_tokens += added

    def engines(self) -> list[str]:
        """The engines `credit` may credit (empty while nothing is held)."""
        return self.index.engines() if self.index else []

    def on_decided(self, decision: Decision) -> None:
        if decision.tokens and decision.endpoint is not None and queued_choice(decision):
            decision.queued = self.index.hold(decision.endpoint, self.keys(decision.tokens))

    def on_served(self, decision: Decision, previous: str | None) -> None:
        # Another engine served (a retry): the first one never queued this prompt.
        if decision.queued is not None and decision.served != decision.endpoint:
            self.index.release(decision.queued)
            decision.queued = None

    def on_ended(self, decision: Decision) -> None:
        if decision.queued is not None:
            self.index.release(decision.queued)
            decision.queued = None

    def state(self) -> dict[str, object]:
        return {"blocks": self.index.blocks(), "total_blocks": self.index.total_blocks,
                "max_blocks": self.index.max_blocks, "skipped": self.index.skipped,
                "credited_tokens": self.credited_tokens, "approx_bytes": self.index.approx_bytes()}
