"""Steps 1-5 of the demo: a prefix followed to its holder, chat templating, load beating locality, and a
client's routing header ignored."""

from __future__ import annotations

from demo.prompts import MODEL, chunk_aligned, prefix_text, summarize
from demo.session import DemoSession, heading

DEST_HEADER = "x-gateway-destination-endpoint"
# Reported running requests that make the holder look loaded in step 4: enough that joining its decode batch
# costs the default policy more than prefilling the whole ~1,500-token prompt on an idle engine (and the
# seed's loadaware at beta 1 more than the prefix is worth).
PHANTOM_RUNNING = 12


async def storyline(demo: DemoSession) -> None:
    """Steps 1-5, each with the decision explained and its claim checked."""
    tok = demo.tok
    engines = sorted(demo.urls)
    config = (await demo.get_json(f"{demo.debug_url}/debug/state")).get("config", [])
    policy = next((s["value"] for s in config if s.get("name") == "policy"), "unknown")
    print(f"fleet: {', '.join(f'{n}={demo.endpoint_of(n)}' for n in engines)}; "
          f"policy {policy} (no --policy: the default); Envoy at {demo.stack.url}", flush=True)

    # 1. cold prompt
    heading(1, "a cold prompt with a long shared prefix")
    suffixes = (" First question: what is cached where?", " Second question: which engine holds it now?",
                " Fourth question: what if the holder is busy?")
    shared = chunk_aligned(tok, prefix_text(tok, 1, 1500),
                           lambda t: (tok.encode_prompt(t + suffixes[0]), tok.encode_prompt(t + suffixes[1])))
    p1 = shared + suffixes[0]
    t1 = tok.encode_prompt(p1)
    r1, d1 = await demo.step_request("/v1/completions", {"model": MODEL, "prompt": p1, "max_tokens": 8},
                                     summarize(p1, len(t1)))
    demo.check(all(c["matched_tokens"] == 0 for c in d1["candidates"]), "no engine held any of it (cold)")
    holder = r1.served_by
    demo.facts["step1"] = holder
    await demo.wait_cached(t1, holder)

    # 2. same prefix, new suffix
    heading(2, "same prefix, new suffix -> the engine that holds it")
    p2 = shared + suffixes[1]
    r2, d2 = await demo.step_request("/v1/completions", {"model": MODEL, "prompt": p2, "max_tokens": 8},
                                     summarize(p2, len(tok.encode_prompt(p2))))
    m2 = max(c["matched_tokens"] for c in d2["candidates"])
    demo.check(r2.served_by == holder, f"went to the holder {holder} (got {r2.served_by})")
    demo.check(m2 / max(1, d2["prompt_tokens"]) > 0.9, f"benefit ~1 ({m2}/{d2['prompt_tokens']})")
    demo.facts["step2"] = r2.served_by

    # 3. chat, twice
    heading(3, "chat requests with a long system message (the sidecar applies the chat template)")
    users = ("Summarize the document.", "List three key terms.")

    def chat(system: str, user: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    system = chunk_aligned(tok, prefix_text(tok, 3, 1500),
                           lambda t: (tok.encode_chat(chat(t, users[0])), tok.encode_chat(chat(t, users[1]))))
    msgs_a = chat(system, users[0])
    ta = tok.encode_chat(msgs_a)
    r3a, _ = await demo.step_request("/v1/chat/completions", {"model": MODEL, "messages": msgs_a, "max_tokens": 8},
                                     f"system {summarize(system, len(tok.encode_prompt(system)))} + user #1 "
                                     f"({len(ta)} tokens templated)")
    chat_holder = r3a.served_by
    await demo.wait_cached(ta, chat_holder)
    msgs_b = chat(system, users[1])
    print("   second chat request: same system message, another user turn, streamed", flush=True)
    r3b, d3b = await demo.step_request("/v1/chat/completions",
                                       {"model": MODEL, "messages": msgs_b, "max_tokens": 8, "stream": True},
                                       f"system <same> + user #2 ({len(tok.encode_chat(msgs_b))} tokens templated)")
    m3 = next(c["matched_tokens"] for c in d3b["candidates"] if c["endpoint"] == d3b["endpoint"])
    demo.check(r3b.served_by == chat_holder and m3 / max(1, d3b["prompt_tokens"]) > 0.9,
               f"followed its prefix to {chat_holder} ({m3}/{d3b['prompt_tokens']} tokens matched after templating)")
    demo.facts["step3"] = f"{chat_holder},{r3b.served_by}"

    # 4. the holder looks loaded
    heading(4, f"the holder {holder} looks loaded ({PHANTOM_RUNNING} running) -> load beats locality")
    await demo.set_phantom(holder, PHANTOM_RUNNING)
    p4 = shared + suffixes[2]
    r4, d4 = await demo.step_request("/v1/completions", {"model": MODEL, "prompt": p4, "max_tokens": 8},
                                     summarize(p4, len(tok.encode_prompt(p4))))
    hc = next(c for c in d4["candidates"] if demo.name(c["endpoint"]) == holder)
    demo.check(hc["matched_tokens"] > 0, f"{holder} still holds the prefix ({hc['matched_tokens']} tokens)")
    demo.check(r4.served_by != holder, f"moved away from the loaded holder {holder} (to {r4.served_by})")
    demo.facts["step4"] = f"{r4.served_by} holder={holder}"
    print("   clearing the phantom load:", flush=True)
    await demo.set_phantom(holder, 0)

    # 5. a spoofed routing header
    heading(5, f"a client-supplied {DEST_HEADER} header is ignored")
    spoof_name = next(n for n in engines if n != chat_holder)
    spoof = demo.endpoint_of(spoof_name)
    msgs_c = chat(system, "Route me to " + spoof_name)
    r5, _ = await demo.step_request("/v1/chat/completions", {"model": MODEL, "messages": msgs_c, "max_tokens": 8},
                                    "system <same as step 3> + user #3", headers={DEST_HEADER: spoof})
    honoured = r5.served_by == spoof_name
    demo.check(not honoured, f"the client's choice {spoof_name} was not honoured")
    demo.check(r5.served_by == chat_holder, f"the sidecar's choice stood: the prefix holder {chat_holder}")
    demo.facts["step5"] = f"{r5.served_by} spoofed={spoof_name} honoured={'yes' if honoured else 'no'}"
