"""Step 9 of the demo: an engine starts failing fast under steady load, is taken out of rotation, and is
back once healed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from demo.prompts import MODEL
from demo.session import DemoSession, heading
from testkit import metrics_text
from testkit.openloop import OpenLoopSender

RATE = 40.0  # requests per second, open loop
FAULT_S = 4.0
HEALED_S = 3.0


async def failing_engine(demo: DemoSession) -> None:
    victim = sorted(demo.urls)[0]
    endpoint = demo.endpoint_of(victim)
    heading(9, f"{victim} starts answering every request with HTTP 500 at once, under {RATE:g} req/s")
    stop = asyncio.Event()

    async def one(n: int) -> tuple[int, str]:
        reply = await demo.send("/v1/completions", {"model": MODEL, "max_tokens": 4,
                                                    "prompt": f"failover request {n} about topic {n % 11}"})
        return reply.status, reply.served_by

    load = OpenLoopSender(RATE, one)
    sender = asyncio.create_task(load.run(stop))
    await asyncio.sleep(1.0)
    before = await decision_counts(demo)
    await demo.post_json(f"{demo.urls[victim]}/sim/fault", {"mode": "error", "status": 500})
    onset = time.monotonic()
    print(f"   POST {demo.urls[victim]}/sim/fault {{\"mode\": \"error\", \"status\": 500}}", flush=True)
    ejected = await wait_state(demo, endpoint, ("ejected", "probing"), 10.0)
    health = await routing_health(demo, endpoint)
    print(f"   the sidecar took {victim} out of rotation after {ejected - onset:.2f}s: {health['state']} "
          f"({health['reason']}), failures so far {health['failures']}", flush=True)
    at_ejection = await decision_counts(demo)
    await asyncio.sleep(max(0.0, onset + FAULT_S - time.monotonic()))
    while_out = await decision_counts(demo)
    await demo.post_json(f"{demo.urls[victim]}/sim/fault", {"mode": "none"})
    healed = time.monotonic()
    print(f"   healed {victim} (POST /sim/fault {{\"mode\": \"none\"}})", flush=True)
    back = await wait_state(demo, endpoint, ("healthy",), 12.0)
    print(f"   {victim} probed back and healthy {back - healed:.2f}s after healing", flush=True)
    back_counts = await decision_counts(demo)
    await asyncio.sleep(HEALED_S)
    stop.set()
    await sender
    after = await decision_counts(demo)

    onset_plus_2 = load.window(onset + 2.0, healed)
    ok = sum(1 for s in onset_plus_2 if s.status == 200)
    out_victim, out_all = delta(at_ejection, while_out, endpoint)
    back_victim, back_all = delta(back_counts, after, endpoint)
    all_ok = sum(1 for s in load.sent if s.status == 200)
    print(f"   clients: {all_ok} of {len(load.sent)} requests answered 200 (Envoy retried each 500 on the next engine "
          f"of the sidecar's list); from 2 s after the onset: {ok} of {len(onset_plus_2)}", flush=True)
    print(f"   decisions for {victim}: {delta(before, at_ejection, endpoint)[0]:.0f} before the ejection, "
          f"{out_victim:.0f} of {out_all:.0f} while failing (its probes), {back_victim:.0f} of {back_all:.0f} "
          f"after it healed", flush=True)
    demo.check(ok >= 0.99 * len(onset_plus_2), f"at least 99% of clients succeeded from 2 s after the onset "
                                                f"({ok}/{len(onset_plus_2)})")
    demo.check(out_victim <= 0.05 * max(1.0, out_all), f"the failing engine got at most 5% of the decisions after "
                                                      f"its ejection ({out_victim:.0f}/{out_all:.0f})")
    demo.check(back - healed <= 10.0 and back_victim > 0, f"healed, it takes requests again within 10 s "
                                                         f"({back - healed:.2f}s, {back_victim:.0f} decisions)")
    # "<seconds to ejection>s,<decisions to it while out>/<all decisions meanwhile>"
    demo.facts["failover"] = f"{ejected - onset:.2f}s,{out_victim:.0f}/{out_all:.0f}"


async def routing_health(demo: DemoSession, endpoint: str) -> dict[str, Any]:
    state = await demo.get_json(f"{demo.debug_url}/debug/state")
    return dict(next(e["routing_health"] for e in state["endpoints"] if e["endpoint"] == endpoint))


async def wait_state(demo: DemoSession, endpoint: str, states: tuple[str, ...], timeout: float) -> float:
    async def reached() -> bool:
        return (await routing_health(demo, endpoint))["state"] in states

    await demo.wait_for(f"{demo.name(endpoint)} {' or '.join(states)}", reached, timeout)
    return time.monotonic()


async def decision_counts(demo: DemoSession) -> dict[str, float]:
    """Decisions per endpoint since the sidecar started (its /metrics counter)."""
    text = await demo.get_text(f"{demo.metrics_url}/metrics")
    return metrics_text.sum_by_label(text, "loadaware_decisions_total", "endpoint")


def delta(before: dict[str, float], after: dict[str, float], endpoint: str) -> tuple[float, float]:
    total = sum(after.get(k, 0) - before.get(k, 0) for k in after)
    return after.get(endpoint, 0) - before.get(endpoint, 0), total
