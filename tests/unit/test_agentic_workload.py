"""The agentic workload generator (experiment.agentic) and its DES run (experiment.agentic_sim)."""

from __future__ import annotations

import itertools

import pytest

from experiment.agentic import Agentic, AgenticSpec, build, roots
from experiment.agentic_des import arm_of, fleet_of
from experiment.agentic_sim import prepare_turns, simulate_agentic

SMALL = AgenticSpec(root_sessions=6, session_rate=1.0, system_tokens=(300, 600), task_tokens=(20, 60),
                    turns=(3, 5), sub_turns=(2, 3), tool_tokens=(50, 300), result_tokens=(30, 60),
                    output_tokens=(8, 16), pause_s=(0.2, 1.0), fanout_prob=0.3, responses_share=0.5,
                    max_context_tokens=4000)


@pytest.fixture(scope="module")
def workload() -> Agentic:
    return build(AgenticSpec(root_sessions=12), 7)


def test_history_grows_monotonically_per_session(workload: Agentic) -> None:
    for session in workload.sessions:
        prompts = [workload.turns[i].prompt_ids() for i in session.turns]
        for before, after in itertools.pairwise(prompts):
            assert len(after) > len(before)
            assert after[: len(before)] == before  # the whole earlier prompt is re-sent (or stored) first
        assert all(workload.turns[i].prompt_tokens <= workload.spec.max_context_tokens for i in session.turns)


def test_sub_agents_share_the_parent_system_prompt_and_run_in_parallel(workload: Agentic) -> None:
    subs = [s for s in workload.sessions if s.parent is not None]
    assert subs
    for s in subs:
        assert s.parent is not None
        parent = workload.sessions[s.parent]
        assert s.system == parent.system and s.api == parent.api
        first = workload.turns[s.turns[0]]
        assert workload.turns[first.after[0]].session == parent.index  # started by a parent's turn
        assert workload.turns[s.turns[0]].system == workload.turns[parent.turns[0]].system
    # The parent's next turn waits for every sub-agent it started (fan-out of 2-4).
    joins = [t for t in workload.turns if len(t.after) > 1]
    assert joins and all(3 <= len(t.after) <= 5 for t in joins)


def test_responses_sessions_chain_their_ids(workload: Agentic) -> None:
    responses = [s for s in workload.sessions if s.api == "responses"]
    assert responses and len(responses) < len(workload.sessions)
    for s in responses:
        turns = [workload.turns[i] for i in s.turns]
        assert turns[0].previous is None and not turns[0].stateful
        for before, after in itertools.pairwise(turns):
            assert after.previous == before.index and after.stateful
            assert len(after.seen_ids()) < len(after.prompt_ids())  # only the instructions and the new input
    for t in workload.turns:
        if t.api == "chat":
            assert not t.stateful and t.seen_ids() == t.prompt_ids()


def test_seeds_are_reproducible() -> None:
    assert build(SMALL, 3) == build(SMALL, 3)
    assert build(SMALL, 3) != build(SMALL, 4)
    assert [t.start_s for t in roots(build(SMALL, 3).turns)] == sorted(t.start_s for t in roots(build(SMALL, 3).turns))


def test_des_default_reaches_every_state_and_a_stateless_arm_misses() -> None:
    prepared = prepare_turns(build(SMALL, 1))
    default = simulate_agentic(prepared, arm_of("auto"), fleet_of("lmcache", "auto"), 1)
    assert default.follow_ups > 0
    assert default.reached == default.follow_ups == default.state_placed
    assert all(r.ok for r in default.run.requests)
    stateless = simulate_agentic(prepared, arm_of("roundrobin-stateless"), fleet_of("lmcache", "roundrobin"), 1)
    assert stateless.follow_ups == default.follow_ups
    assert stateless.reached < stateless.follow_ups  # misses: 404, re-sent with the whole history
    assert all(r.ok for r in stateless.run.requests)  # every turn still answered (after its re-send)
