"""Step 10 of the demo: agentic traffic. A Responses follow-up lands on the engine that holds its stored turn
while that engine looks loaded and the others are idle (state beats load); a stored response's own GET goes
there too; an Anthropic Messages request is decided by its rendered prompt and its repeat follows its prefix."""

from __future__ import annotations

import json

from demo.prompts import MODEL, prefix_text
from demo.session import DemoSession, heading

PHANTOM_RUNNING = 12  # as step 4: enough that load alone would send anything else elsewhere


async def agentic(demo: DemoSession) -> None:
    heading(10, "agentic traffic: a Responses follow-up goes to its stored state; Messages by its prefix")
    first, _ = await demo.step_request(
        "/v1/responses", {"model": MODEL, "input": "Plan the refactor of the storage layer.", "store": True,
                          "max_output_tokens": 8}, "a first turn, stored (store: true)")
    response_id = json.loads(first.text)["id"]
    holder = first.served_by
    print(f"   the engine keeps response {response_id} in its own process: only {holder} can continue it",
          flush=True)
    await demo.set_phantom(holder, PHANTOM_RUNNING)
    try:
        follow, d2 = await demo.step_request(
            "/v1/responses", {"model": MODEL, "input": "Go on with step two.", "previous_response_id": response_id,
                              "max_output_tokens": 8},
            f"a follow-up naming previous_response_id={response_id} while {holder} looks loaded")
        demo.check(follow.served_by == holder and d2.get("rule") == "state",
                   f"placed on the holder {holder} by its state (rule {d2.get('rule')}, found {d2.get('state')})")
        demo.check(d2.get("ranked") == [d2["endpoint"]], "named alone: a retry elsewhere would find no such response")
        idler = [c for c in d2["candidates"] if c["load"] < max(x["load"] for x in d2["candidates"])]
        demo.check(bool(idler), f"while {', '.join(demo.name(c['endpoint']) for c in idler) or 'nobody'} "
                                f"had less load")
        reply = await demo.send_get(f"/v1/responses/{response_id}")
        demo.check(reply.status == 200 and reply.served_by == holder,
                   f"GET /v1/responses/{response_id} answered by {reply.served_by} (HTTP {reply.status})")
    finally:
        await demo.set_phantom(holder, 0)
    demo.facts["agentic"] = f"follow-up={follow.served_by} holder={holder}"
    await messages_by_prefix(demo)


async def messages_by_prefix(demo: DemoSession) -> None:
    system = prefix_text(demo.tok, 10, 1200)
    questions = ("Review the first patch.", "Review the second patch.")

    def body(question: str) -> dict[str, object]:
        return {"model": MODEL, "max_tokens": 8, "system": [{"type": "text", "text": system}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": question}]}]}

    r1, d1 = await demo.step_request("/v1/messages", body(questions[0]),
                                     f"Anthropic Messages: a {d_tokens(demo, system)}-token system block + a question")
    demo.check(d1["prompt_tokens"] > 1000, f"decided by its rendered prompt ({d1['prompt_tokens']} tokens)")
    if demo.stack.lmcache is not None:  # LMCache learns what the engine stored: wait until it credits it
        await demo.wait_cached(demo.tok.encode_chat([{"role": "system", "content": system},
                                                     {"role": "user", "content": questions[0]}]), r1.served_by)
    r2, d2 = await demo.step_request("/v1/messages", body(questions[1]), "the same system block, another question")
    matched = next(c["matched_tokens"] for c in d2["candidates"] if c["endpoint"] == d2["endpoint"])
    demo.check(r2.served_by == r1.served_by and matched >= d2["prompt_tokens"] // 2,
               f"followed its prefix to {r1.served_by} ({matched}/{d2['prompt_tokens']} tokens matched)")
    demo.facts["messages"] = f"{r1.served_by},{r2.served_by}"


def d_tokens(demo: DemoSession, text: str) -> int:
    return len(demo.tok.encode_prompt(text))
