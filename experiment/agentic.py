"""An agentic workload, deterministic per seed: agent sessions whose context grows every turn.

    python -m experiment.agentic --seeds 3 [--role design|held-out|both] [--arms ...] [--doc docs/results.md]

(the command runs the discrete-event simulation, experiment.agentic_des; this module is the generator: pure, no
I/O, no clock.)

A root session is an agent working a task:

- its first turn sends a system prompt (one of `n_systems`, drawn per root session: an agent product's long
  instructions and tool list, shared by every session that runs it) and a task (user text);
- every later turn follows the previous one's reply after a tool-call pause (`pause_s`, uniform) and adds the
  tool's output (`tool_tokens`, log-uniform) as new input: the context grows by the reply and the tool output;
- at some turns (`fanout_prob`, never the last) the agent starts `fanout` sub-agents in parallel (after a
  launch pause); each shares its parent's system prompt, has its own task and a few turns of its own; the
  parent's next turn waits for all of them and adds their results (`result_tokens` each) as its new input;
- a share of root sessions (`responses_share`; their sub-agents inherit the API) speak the Responses API with
  `store`: each follow-up names the previous turn's response (`previous_response_id`) and sends only its new
  input and the instructions (the engine holding the stored response renders the history); the others speak
  chat completions and re-send the whole history every turn.

A session ends after its drawn number of turns, or before a turn whose prompt would pass `max_context_tokens`.
Sizes are in words of `sim.make_tokenizer.WORDS`, one token each for the simulator's tokenizer (the chat
template's own tokens aside); the simulator's token ids are the word indices plus `WORD_BASE`, each message led
by one token of its role.

What is seeded by what: `np.random.default_rng([seed, stream])`, one stream for the session plan and one for
the texts, so the same seed always gives the same sessions, pauses and words.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from sim.make_tokenizer import WORDS

AgentApi = Literal["chat", "responses"]
Role = Literal["system", "user", "assistant"]

ROLE_TOKEN: dict[str, int] = {"system": 1, "user": 2, "assistant": 3}
WORD_BASE = 16  # token id of WORDS[0] in the simulator's view
_STREAM_PLAN, _STREAM_TEXT = 11, 12


@dataclass(frozen=True)
class AgenticSpec:
    root_sessions: int = 40  # root sessions per seed
    session_rate: float = 0.5  # root sessions started per second (Poisson)
    n_systems: int = 4  # distinct system prompts (agent products) the root sessions draw from, uniformly
    system_tokens: tuple[int, int] = (1500, 4000)  # a system prompt's length, uniform
    task_tokens: tuple[int, int] = (50, 400)  # a session's first user message, uniform
    turns: tuple[int, int] = (3, 10)  # a root session's turns, uniform (inclusive)
    sub_turns: tuple[int, int] = (2, 4)  # a sub-agent's turns
    tool_tokens: tuple[int, int] = (100, 1500)  # a tool output (a follow-up's new input), log-uniform
    result_tokens: tuple[int, int] = (100, 400)  # one sub-agent's result in its parent's next input
    output_tokens: tuple[int, int] = (32, 160)  # a turn's reply (max_tokens, ignore_eos), uniform
    pause_s: tuple[float, float] = (0.5, 5.0)  # tool-call pause before a follow-up, uniform
    fanout_prob: float = 0.25  # chance that a root turn (not the last) starts sub-agents
    fanout: tuple[int, int] = (2, 4)  # sub-agents started at such a turn
    responses_share: float = 0.4  # root sessions speaking the Responses API (their sub-agents too)
    max_context_tokens: int = 16_000  # no turn's prompt passes this

    def __post_init__(self) -> None:
        if self.root_sessions < 1 or self.session_rate <= 0 or self.n_systems < 1:
            raise ValueError("root_sessions, session_rate and n_systems must be positive")
        if not 0.0 <= self.responses_share <= 1.0 or not 0.0 <= self.fanout_prob <= 1.0:
            raise ValueError("shares must be in [0, 1]")
        if self.max_context_tokens < self.system_tokens[1] + self.task_tokens[1] + self.output_tokens[1]:
            raise ValueError("max_context_tokens leaves no room for a first turn")


@dataclass(frozen=True)
class Segment:
    """One message: its role and its words (indices into WORDS)."""

    role: Role
    words: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return len(self.words) + 1  # + its role token

    def text(self) -> str:
        return " ".join(WORDS[w] for w in self.words)

    def token_ids(self) -> list[int]:
        return [ROLE_TOKEN[self.role], *(WORD_BASE + w for w in self.words)]


@dataclass(frozen=True)
class Turn:
    """One request of a session. `history` + `new_input` is the conversation the engine renders (for a
    Responses follow-up the holder renders `history` from its store); `output` is the reply the simulator
    produces (the real engines produce their own)."""

    index: int  # position in Agentic.turns (dependencies come first)
    session: int
    turn: int  # 0 = the session's first
    api: AgentApi
    system: Segment
    history: tuple[Segment, ...]  # everything before the new input: system, earlier inputs and replies
    new_input: tuple[Segment, ...]
    output: Segment
    max_tokens: int
    after: tuple[int, ...]  # turns that must end before this one is sent (none: sent at `start_s`)
    pause_s: float  # after the last of `after` ends
    start_s: float = 0.0  # a root session's first turn: its send time from the run's start
    previous: int | None = None  # the session's previous turn (its response is this one's state, responses)

    @property
    def follow_up(self) -> bool:
        return self.previous is not None

    @property
    def stateful(self) -> bool:
        """A Responses follow-up: it needs the previous turn's stored response."""
        return self.api == "responses" and self.previous is not None

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self.history + self.new_input

    @property
    def prompt_tokens(self) -> int:
        return sum(s.tokens for s in self.segments)

    def prompt_ids(self) -> list[int]:
        """The engine's prompt (the whole conversation)."""
        return [t for s in self.segments for t in s.token_ids()]

    def seen_ids(self) -> list[int]:
        """The prompt as a router sees it in the body: a Responses follow-up carries its instructions and new
        input only; anything else the whole conversation."""
        segs = (self.system, *self.new_input) if self.stateful else self.segments
        return [t for s in segs for t in s.token_ids()]


@dataclass(frozen=True)
class Session:
    index: int
    api: AgentApi
    parent: int | None  # None: a root session
    system: int  # which system prompt
    turns: tuple[int, ...] = field(default=())  # Turn indices in order


@dataclass(frozen=True)
class Agentic:
    spec: AgenticSpec
    seed: int
    turns: tuple[Turn, ...]
    sessions: tuple[Session, ...]

    def describe(self) -> dict[str, Any]:
        prompts = [t.prompt_tokens for t in self.turns]
        return {"turns": len(self.turns), "sessions": len(self.sessions),
                "sub_sessions": sum(1 for s in self.sessions if s.parent is not None),
                "stateful_follow_ups": sum(1 for t in self.turns if t.stateful),
                "prompt_tokens_mean": float(np.mean(prompts)), "prompt_tokens_max": max(prompts),
                "span_s": max(t.start_s for t in self.turns)}


class _Plan:
    """The builder's state: sessions and turns in dependency order."""

    def __init__(self, spec: AgenticSpec, seed: int) -> None:
        self.spec = spec
        self.plan = np.random.default_rng([seed, _STREAM_PLAN])
        self.text = np.random.default_rng([seed, _STREAM_TEXT])
        self.systems = [Segment("system", self._words_at(n, k)) for k, n in enumerate(
            self.plan.integers(spec.system_tokens[0], spec.system_tokens[1] + 1, spec.n_systems))]
        self.turns: list[Turn] = []
        self.sessions: list[Session] = []

    def _words_at(self, n: int, k: int) -> tuple[int, ...]:
        """A system prompt's words: a fixed opening per prompt (its first block differs) and random words."""
        return (k % len(WORDS), (k // len(WORDS)) % len(WORDS), *self._words(int(n) - 3))

    def _words(self, n: int) -> tuple[int, ...]:
        return tuple(int(w) for w in self.text.integers(0, len(WORDS), max(1, n)))

    def uniform_int(self, bounds: tuple[int, int]) -> int:
        return int(self.plan.integers(bounds[0], bounds[1] + 1))

    def log_uniform(self, bounds: tuple[int, int]) -> int:
        lo, hi = math.log(bounds[0]), math.log(bounds[1])
        return round(math.exp(self.plan.uniform(lo, hi)))

    def pause(self) -> float:
        return float(self.plan.uniform(*self.spec.pause_s))

    def session(self, api: AgentApi, parent: int | None, system: int, after: tuple[int, ...], pause: float,
                start_s: float, n_turns: int, may_fan_out: bool) -> int:
        """Plan one session (and its sub-agents); returns the index of its last turn."""
        spec, index = self.spec, len(self.sessions)
        self.sessions.append(Session(index, api, parent, system))
        system_seg = self.systems[system]
        history: tuple[Segment, ...] = (system_seg,)
        new_input: tuple[Segment, ...] = (Segment("user", self._words(self.uniform_int(spec.task_tokens) - 1)),)
        mine: list[int] = []
        previous: int | None = None
        for k in range(n_turns):
            out_n = self.uniform_int(spec.output_tokens)
            if sum(s.tokens for s in history + new_input) + out_n > spec.max_context_tokens:
                break
            output = Segment("assistant", self._words(out_n - 1))
            turn = Turn(len(self.turns), index, k, api, system_seg, history, new_input, output, out_n, after,
                        pause, start_s if k == 0 else 0.0, previous)
            self.turns.append(turn)
            mine.append(turn.index)
            previous = turn.index
            history = history + new_input + (output,)
            after, pause = (turn.index,), self.pause()
            if may_fan_out and k < n_turns - 1 and self.plan.random() < spec.fanout_prob:
                after, new_input = self._fan_out(api, index, system, turn.index)
                pause = self.pause()
            else:
                new_input = (Segment("user", self._words(self.log_uniform(spec.tool_tokens) - 1)),)
        self.sessions[index] = Session(index, api, parent, system, tuple(mine))
        return mine[-1] if mine else (after[0] if after else -1)

    def _fan_out(self, api: AgentApi, parent: int, system: int, at_turn: int
                 ) -> tuple[tuple[int, ...], tuple[Segment, ...]]:
        """Sub-agents started after `at_turn`, in parallel; (their last turns, the parent's next input)."""
        ends = []
        results = []
        for _ in range(self.uniform_int(self.spec.fanout)):
            last = self.session(api, parent, system, (at_turn,), self.pause(), 0.0,
                                self.uniform_int(self.spec.sub_turns), False)
            ends.append(last)
            results.append(Segment("user", self._words(self.uniform_int(self.spec.result_tokens) - 1)))
        return (at_turn, *ends), tuple(results)


def build(spec: AgenticSpec, seed: int) -> Agentic:
    """The seed's sessions. Turns are listed so that every turn comes after the turns it waits for."""
    plan = _Plan(spec, seed)
    starts = np.cumsum(plan.plan.exponential(1.0 / spec.session_rate, spec.root_sessions))
    starts -= starts[0]
    for i in range(spec.root_sessions):
        api: AgentApi = "responses" if plan.plan.random() < spec.responses_share else "chat"
        system = int(plan.plan.integers(0, spec.n_systems))
        plan.session(api, None, system, (), 0.0, float(starts[i]), plan.uniform_int(spec.turns), True)
    return Agentic(spec, seed, tuple(plan.turns), tuple(plan.sessions))


def roots(turns: Sequence[Turn]) -> list[Turn]:
    """The turns sent at a fixed time (root sessions' first turns)."""
    return [t for t in turns if not t.after]


def main(argv: Sequence[str] | None = None) -> int:
    from experiment.agentic_des import main as des_main  # the simulation imports this module: import it late

    return des_main(argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
