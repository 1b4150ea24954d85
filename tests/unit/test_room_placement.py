"""With admission on, a decision moves the request off an engine without room for its band when another
candidate has some (routing/room.py): the policy's ranking orders the engines with room."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from loadaware.admission.controller import AdmissionController, AdmissionSettings, Verdict
from loadaware.admission.objectives import Objectives
from loadaware.admission.saturation import PoolRoom
from loadaware.fleet.registry import EndpointRegistry
from loadaware.lifecycle import Decision, RequestLifecycle
from loadaware.load.tracker import EngineStats, LoadTracker
from loadaware.policies import make_policy
from loadaware.routing.builder import build_decider
from loadaware.routing.request import InferenceRequest

FLEET = ("127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000")
HOLDER, SECOND, THIRD = FLEET


class Holds:
    """The first engine holds the whole prompt: loadaware chooses it, then the second (less loaded), then the
    third."""

    name = "fixed"

    async def matches(self, tokens: object, endpoints: tuple[str, ...], salt: str | None = None) -> dict[str, int]:
        return {HOLDER: 100}


def decide(room: Callable[[str], bool] | None) -> Decision:
    loads = LoadTracker(stale_s=5)
    lifecycle = RequestLifecycle()
    lifecycle.subscribe(loads)
    registry = EndpointRegistry(FLEET)
    for ep in FLEET:
        loads.join(ep)
    loads.record(THIRD, EngineStats(3.0, 0.0, 0.1, loads.clock()))
    decider = build_decider(make_policy("loadaware"), registry, loads, lifecycle, prefix_source=Holds(), fallbacks=2)
    return asyncio.run(decider.decide(InferenceRequest("completions", prompt=list(range(100))), "r", room=room))


def test_a_choice_with_room_stands() -> None:
    d = decide(lambda ep: True)
    assert d.endpoint == HOLDER and d.rule == "" and d.reasons == ()


def test_the_best_ranked_engine_with_room_takes_the_request() -> None:
    d = decide(lambda ep: ep != HOLDER)
    assert d.endpoint == SECOND and d.rule == "room"
    assert d.ranked == (SECOND, HOLDER, THIRD)  # the policy's choice is the first fallback
    assert decide(lambda ep: ep == THIRD).endpoint == THIRD


def test_without_room_anywhere_the_policy_chooses() -> None:
    d = decide(lambda ep: False)
    assert d.endpoint == HOLDER and d.rule == ""


def test_a_failing_room_test_leaves_the_choice() -> None:
    def broken(ep: str) -> bool:
        raise RuntimeError("boom")

    d = decide(broken)
    assert d.endpoint == HOLDER and "admission_room_error" in d.reasons


@pytest.mark.parametrize("late_reserved_slots", [0, 1])
def test_admission_says_which_engines_have_room_for_which_band(late_reserved_slots: int) -> None:
    """The top band may take any free slot; a lower band only one beyond the reserve; a late request one beyond
    --late-reserved-slots."""
    loads = LoadTracker(stale_s=5)
    room = PoolRoom(loads, lambda: FLEET, set, 0)
    controller = AdmissionController(AdmissionSettings(reserved_slots=1, late_reserved_slots=late_reserved_slots),
                                     Objectives({"critical": 10, "batch": -1}), room)
    now = loads.clock()
    for ep, running in zip(FLEET, (8.0, 7.0, 6.0)):
        room.scraped(ep, 8.0, 1.0)  # each has queued once: its batch of 8 is known
        loads.record(ep, EngineStats(running, 0.0, 0.5, now))
    top, lower = controller.room_for(Verdict(True, 10, "admitted")), controller.room_for(Verdict(True, -1, "admitted"))
    late = controller.room_for(Verdict(True, -1, "released", held=True, late=True))
    assert [top(ep) for ep in FLEET] == [False, True, True]
    assert [lower(ep) for ep in FLEET] == [False, False, True]
    if late_reserved_slots:  # the reserve is left to the top band
        assert [late(ep) for ep in FLEET] == [False, False, True]
    else:  # released into any free slot, the reserve included
        assert [late(ep) for ep in FLEET] == [False, True, True]
