"""The agentic workload (experiment.agentic) in the discrete-event simulator, through the sidecar's own pipeline.

`AgenticSimulation` is `experiment.des.Simulation` (the same engine model, the same `ProductRouter`) with three
things the reference workload has no need of:

- closed-loop sessions: a turn is sent `pause_s` after the turns it waits for have ended (the previous turn, or
  the sub-agents a turn started), not at a fixed time; root sessions' first turns at their drawn start times;
- the Responses API's store: an engine keeps every response it completed for a request that stores (the whole
  conversation rendered so far and its reply). A follow-up naming it is, at its holder, a prefix hit on that
  history (the reply's full blocks are cached too, as vLLM caches generated tokens' blocks); anywhere else it
  FAILS at once (vLLM's 404): it is counted, and the client re-sends the turn with its whole history (no
  `previous_response_id`, stored again) after `MISS_RTT_S`. The turn's TTFT runs from its first send, so a miss
  costs what it costs an agent: the round trip and a prefill of the whole history wherever the re-send lands;
- state routing: a sidecar arm's `ProductRouter` carries a `loadaware.fleet.state_holders.StateHolders`, taught
  each stored response's engine when it completes, as the sidecar learns it from the response (the Decider then
  places a follow-up on its holder: Decision.rule "state"). Peer arms and `STATELESS` arms have none: their
  follow-ups go where their policy sends the request it sees (the instructions and the new input only).

What a router sees of a turn: a chat turn's whole conversation; a Responses follow-up's instructions and new
input (`Turn.seen_ids`). The prefix source's answer and the peers' block signals are computed on that view.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from experiment.agentic import Agentic, Turn
from experiment.des import (
    _ARRIVE,
    _SAMPLE,
    _SCRAPE,
    Arm,
    FleetConfig,
    Prepared,
    SimRequest,
    Simulation,
    _blocks_from,
    _Engine,
    _Req,
)
from experiment.records import RequestRecord, RunRecords
from loadaware.fleet.state_holders import StateHolders
from loadaware.routing.request import InferenceRequest
from sim.lmcache_chunks import chunk_keys
from sim.prefix_cache import Block

MISS_RTT_S = 0.005  # a follow-up's 404 and the client's re-send (the sidecar's decision and two short hops)
STATELESS_SUFFIX = "-stateless"  # an arm name ending so: the sidecar with no state routing (an ablation)
BLOCK = 16


def response_id(turn: int) -> str:
    return f"resp_{turn:08x}"


@dataclass(frozen=True)
class PreparedTurns:
    """Per turn: the engine's view (SimRequest), the router's view, and the blocks cached after its reply."""

    agentic: Agentic
    engine: tuple[SimRequest, ...]
    seen: tuple[SimRequest, ...]  # a Responses follow-up's instructions + new input; else `engine`'s own
    after: tuple[tuple[Block, ...], ...]  # the full blocks of prompt + reply


def _sim_request(turn: Turn, tokens: list[int], blocks: list[Block]) -> SimRequest:
    return SimRequest(turn.index, turn.start_s, 0, turn.session, len(tokens), turn.max_tokens, tuple(blocks),
                      tuple(b.key for b in blocks), tuple(chunk_keys(tokens)))


def _extend(tokens: list[int], blocks: list[Block]) -> list[Block]:
    """`blocks` (the full blocks of a prefix of `tokens`) extended to every full block of `tokens`."""
    parent = blocks[-1].key if blocks else None
    return blocks + _blocks_from(tokens, len(blocks) * BLOCK, parent, BLOCK)


def prepare_turns(agentic: Agentic) -> PreparedTurns:
    """Hash every turn once per seed: a session's turn extends its previous turn's prompt + reply, whose blocks
    are reused."""
    engine: list[SimRequest] = []
    seen: list[SimRequest] = []
    after: list[tuple[Block, ...]] = []
    carried: dict[int, list[Block]] = {}  # session -> full blocks of its last prompt + reply
    for turn in agentic.turns:
        tokens = turn.prompt_ids()
        blocks = _extend(tokens, carried.get(turn.session, []))
        req = _sim_request(turn, tokens, blocks)
        engine.append(req)
        if turn.stateful:
            view = turn.seen_ids()
            seen.append(_sim_request(turn, view, _extend(view, [])))
        else:
            seen.append(req)
        full = tokens + turn.output.token_ids()
        carried[turn.session] = _extend(full, blocks)
        after.append(tuple(carried[turn.session]))
    return PreparedTurns(agentic, tuple(engine), tuple(seen), tuple(after))


@dataclass
class AgenticOutcome:
    """What the agentic run adds to the records: per stateful follow-up whether it reached its state."""

    run: RunRecords
    follow_ups: int  # Responses follow-ups sent
    reached: int  # of them, placed on the engine holding their state
    state_placed: int  # of them, placed by the sidecar's state rule (Decision.rule == "state")
    turns: tuple[Turn, ...]


class AgenticSimulation(Simulation):
    def __init__(self, prepared: PreparedTurns, arm: Arm, config: FleetConfig, seed: int = 0,
                 stateful_router: bool = True) -> None:
        super().__init__(Prepared((), (), 0.0), arm, config, seed)
        self.turns = prepared
        self.holders: StateHolders | None = None
        if stateful_router and not self._peer:
            self.holders = StateHolders(probe=None, clock=lambda: self.now)
            self.router.attach_state(self.holders)
        n = len(prepared.engine)
        self._waiting_on = [len(t.after) for t in prepared.agentic.turns]
        self._dependents: list[list[int]] = [[] for _ in range(n)]
        for t in prepared.agentic.turns:
            for d in t.after:
                self._dependents[d].append(t.index)
        self._holder: dict[int, str] = {}  # turn -> the engine that stored its response
        self._retried: set[_Req] = set()  # re-sends after a miss (stateless)
        self._records: list[RequestRecord] = [RequestRecord(t.index, 0.0, prompt_tokens=t.prompt_tokens,
                                                            prefix=t.session) for t in prepared.agentic.turns]
        self.follow_ups = self.reached = self.state_placed = 0

    # ---- sending -------------------------------------------------------------------------------------
    def _arrive(self, r: _Req, t: float) -> None:
        self._pending -= 1
        self._open += 1
        retried = r in self._retried
        turn = self.turns.agentic.turns[r.sim.index]
        if r.record is not None and not retried:
            r.record.send_t = t
        stateful = turn.stateful and not retried
        engine, matched = self._decide_turn(turn, stateful)
        decision, self._decision = self._decision, None
        if stateful:
            self.follow_ups += 1
            self.state_placed += decision is not None and decision.rule == "state"
            assert turn.previous is not None
            if engine.name != self._holder.get(turn.previous):
                self._miss(r, decision, t)
                return
            self.reached += 1
        r.decision = decision
        self._dispatch(r, engine, matched, t)

    def _miss(self, r: _Req, decision: object, t: float) -> None:
        """The engine answers 404 at once; the client re-sends the turn with its whole history."""
        if decision is not None:
            self.router.ended(decision)  # type: ignore[arg-type]
        self._open -= 1
        again = _Req(r.sim, r.record)
        self._retried.add(again)
        self._pending += 1
        self._push(t + MISS_RTT_S, _ARRIVE, again)

    def _decide_turn(self, turn: Turn, stateful: bool) -> tuple[_Engine, int]:
        """The router's decision on what it sees of the turn (a stateful follow-up: instructions + new input and
        the stored response's id)."""
        seen = self.turns.seen[turn.index] if stateful else self.turns.engine[turn.index]
        router = self.router
        if self.policy.needs.prefix and self.config.credit != "approx" and self.config.tokenizer:
            router.exact.answer = self._matches(seen)
        tokens = self._tokens(seen)
        request = InferenceRequest("completions", prompt=tokens if tokens is not None else "?",
                                   state_id=response_id(turn.previous) if stateful and turn.previous is not None
                                   else None, stores=turn.api == "responses")
        decision = router.decide_request(request)
        self._decision = decision
        engine = self._by_name[decision.endpoint] if decision.endpoint is not None else self.engines[0]
        matched = next((c.matched_tokens for c in decision.candidates if c.endpoint == engine.name), 0)
        return engine, matched

    def _seen_keys(self, r: _Req) -> tuple[int, ...]:
        turn = self.turns.agentic.turns[r.sim.index]
        return self.turns.seen[turn.index].block_keys if turn.stateful and r not in self._retried \
            else r.sim.block_keys

    def _track_decided(self, e: _Engine, r: _Req, matched: int, t: float) -> None:
        if self._peer:  # the peers count the blocks of the request they routed (what they saw of it)
            keys = self._seen_keys(r)
            e.kv_refs.hold(keys)
            e.routed.update(keys)

    def _track_ended(self, e: _Engine, r: _Req) -> None:
        if self._peer:
            e.kv_refs.release(self._seen_keys(r))

    # ---- ending --------------------------------------------------------------------------------------
    def _finish(self, r: _Req, t: float) -> None:
        e = r.engine
        assert e is not None
        index = r.sim.index
        e.cache.insert_blocks(self.turns.after[index])  # the reply's full blocks stay cached
        super()._finish(r, t)
        self._retried.discard(r)
        if self.turns.agentic.turns[index].api == "responses":
            self._holder[index] = e.name
            if self.holders is not None:
                self.holders.learn(response_id(index), e.name)
        for d in self._dependents[index]:
            self._waiting_on[d] -= 1
            if self._waiting_on[d] == 0:
                self._release_at(d, t + self.turns.agentic.turns[d].pause_s)

    def _release_at(self, index: int, at: float) -> None:
        self._push(at, _ARRIVE, _Req(self.turns.engine[index], self._records[index]))

    def run_turns(self) -> AgenticOutcome:
        turns = self.turns.agentic.turns
        self._pending = len(turns)
        self._measured_open = len(turns)
        self.records = list(self._records)
        self._measuring = True
        self._sample(0.0)
        self._push(self.config.sample_interval_s, _SAMPLE, None)
        if self.config.router_scrape_interval_s > 0:
            self._push(0.0, _SCRAPE, None)
        for turn in turns:
            if not turn.after:
                self._release_at(turn.index, turn.start_s)
        self._loop()
        ends = [r.end_t for r in self.records if r.end_t is not None]
        run = RunRecords(self.arm.name, self.seed, self.records, self.samples, (-1e-9, max(ends, default=0.0)),
                         0.0)
        return AgenticOutcome(run, self.follow_ups, self.reached, self.state_placed, turns)


def simulate_agentic(prepared: PreparedTurns, arm: Arm, config: FleetConfig, seed: int = 0) -> AgenticOutcome:
    """One arm on one seed's sessions. An arm named `<policy>-stateless` is the sidecar without state routing."""
    stateful = not arm.name.endswith(STATELESS_SUFFIX)
    return AgenticSimulation(prepared, arm, config, seed, stateful_router=stateful).run_turns()


def hit_rate(outcome: AgenticOutcome) -> float:
    """Engines' GPU prefix hits over queries (tokens), over the whole run."""
    last: dict[str, tuple[float, float]] = {}
    for s in outcome.run.samples:
        last[s.engine] = (s.prefix_queries, s.prefix_hits)
    queries = sum(q for q, _ in last.values())
    return sum(h for _, h in last.values()) / queries if queries else 0.0


def ttfts(outcome: AgenticOutcome, only: Sequence[Turn] | None = None) -> list[float]:
    wanted = None if only is None else {t.index for t in only}
    return [r.ttft for r in outcome.run.requests
            if r.ok and r.ttft is not None and (wanted is None or r.index in wanted)]
