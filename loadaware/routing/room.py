"""After the pick, with admission on: the choice goes to an engine with room for the request's band.

    room(e)  = admission's: a free batch slot (for a lower band or a late request with --reserved-slots N, one
               beyond its reserve per engine; under auto the reserve is the pool's, kept when it was let go)
               (loadaware/admission/controller.py, room_for)
    choice   = the policy's (or the session's) choice          if room(choice)
               the best-ranked candidate with room             if some candidate has room (rule "room")
               the policy's choice                             if none has (the pool is saturated: the request was
                                                               held or placed by admission's own rules)

Admission decides whether a request goes now; the policy decides where. Without this step a request admitted
because one engine had a free slot could be placed on another whose batch is full, and wait in that engine's queue
behind everything there: the top band's requests were losing their reserved slot that way. Ranked by the policy's
own scores (ties as it breaks them), so the prefix and load terms still order the engines with room.
"""

from __future__ import annotations

from loadaware.policies import Choice, ranked
from loadaware.routing.context import DecisionContext

ROOM_RULE = "room"


def prefer_room(ctx: DecisionContext) -> None:
    has_room, choice, candidates = ctx.room, ctx.choice, ctx.candidates
    if has_room is None or choice is None or len(candidates) < 2:
        return
    try:
        if has_room(candidates[choice.index].endpoint):
            return
        for i in ranked(choice, candidates, len(candidates))[1:]:
            if has_room(candidates[i].endpoint):
                ctx.choice = Choice(i, choice.scores, ROOM_RULE)
                return
    except Exception as exc:  # noqa: BLE001 - room is advice: the choice stands
        ctx.degrade("admission_room_error", exc)
