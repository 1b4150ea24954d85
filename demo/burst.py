"""Step 6 of the demo: a burst of mixed traffic, then the whole run's accounting."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

from demo.prompts import MODEL, prefix_text
from demo.session import DemoSession, Reply, heading
from testkit import metrics_text


async def burst(demo: DemoSession, n_requests: int = 60, n_prefixes: int = 16, concurrency: int = 8) -> None:
    """Step 6: mixed chat/completions, streamed or not, Zipf-popular prefixes; then the whole run's
    accounting from the sidecar (no fallbacks, in-flight back at 0)."""
    heading(6, f"a burst: {n_requests} mixed requests over {n_prefixes} prefixes, {concurrency} at a time")
    tok = demo.tok
    rng = random.Random(6)
    prefixes = [prefix_text(tok, 100 + i, 1000) for i in range(n_prefixes)]
    # Skewed popularity (Zipf-like): a few hot prefixes and a tail; every prefix at least once.
    weights = [1.0 / (i + 1) ** 0.9 for i in range(n_prefixes)]
    picks = list(range(n_prefixes)) + rng.choices(range(n_prefixes), weights, k=n_requests - n_prefixes)
    rng.shuffle(picks)
    jobs: list[tuple[str, dict[str, Any]]] = []
    for k, i in enumerate(picks):
        stream = k % 2 == 0
        if k % 3 == 0:
            jobs.append(("/v1/chat/completions", {"model": MODEL, "max_tokens": 16, "stream": stream, "messages": [
                {"role": "system", "content": prefixes[i]}, {"role": "user", "content": f"request {k}"}]}))
        else:
            jobs.append(("/v1/completions", {"model": MODEL, "max_tokens": 16, "stream": stream,
                                             "prompt": prefixes[i] + f" request {k}"}))
    n_stream = sum(1 for _, b in jobs if b["stream"])
    n_chat = sum(1 for p, _ in jobs if "chat" in p)
    print(f"   {n_chat} chat + {n_requests - n_chat} completions, {n_stream} streamed; "
          f"prefixes of ~{len(tok.encode_prompt(prefixes[0]))} tokens, Zipf-like popularity", flush=True)
    sem = asyncio.Semaphore(concurrency)

    async def one(path: str, body: dict[str, Any]) -> Reply:
        async with sem:
            return await demo.send(path, body)

    t0 = time.monotonic()
    replies = await asyncio.gather(*(one(p, b) for p, b in jobs))
    elapsed = time.monotonic() - t0
    ids = {r.request_id for r in replies}
    decisions = {d["request_id"]: d for d in await demo.decisions(256) if d["request_id"] in ids}
    by_engine = Counter(r.served_by for r in replies)
    ok = sum(1 for r in replies if r.status == 200)
    agree = sum(1 for r in replies if r.request_id in decisions
                and demo.name(decisions[r.request_id]["endpoint"]) == r.served_by)
    with_match = sum(1 for d in decisions.values() if any(c["matched_tokens"] > 0 for c in d["candidates"]))
    routed = sum(1 for d in decisions.values() if d["outcome"] == "routed")
    frac = with_match / max(1, len(decisions))
    print(f"   done in {elapsed:.2f}s", flush=True)
    print(f"      {'engine':<10} {'requests':>8}", flush=True)
    for name in sorted(demo.urls):
        print(f"      {name:<10} {by_engine.get(name, 0):>8}", flush=True)
    print(f"   decisions with a non-empty LMCache match: {with_match}/{len(decisions)} = {frac:.2f} "
          f"(at most {n_requests - n_prefixes}: each prefix's first request is cold, and so is a repeat "
          f"sent while its first is still running)", flush=True)
    demo.check(ok == n_requests, f"{ok}/{n_requests} HTTP 200")
    demo.check(len(decisions) == n_requests and agree == n_requests,
               f"{agree}/{n_requests} served by the engine the sidecar chose")
    demo.check(routed == len(decisions), f"{routed}/{len(decisions)} decisions routed (no fallback)")
    demo.check(frac >= 0.4, f"most repeat requests found their prefix ({frac:.2f} >= 0.40)")
    demo.check(len(by_engine) == len(demo.urls), "every engine got traffic")
    demo.facts["burst"] = f"{ok}/{n_requests} match_fraction={frac:.2f} " + ",".join(
        f"{n}:{by_engine.get(n, 0)}" for n in sorted(demo.urls))

    # Whole-run accounting from the sidecar's /metrics and /debug/state.
    metrics = await demo.get_text(f"{demo.metrics_url}/metrics")
    fallbacks = metrics_text.metric_sum(metrics, "loadaware_fallbacks_total")
    decided = metrics_text.metric_sum(metrics, "loadaware_decisions_total")
    print(f"   /metrics: loadaware_decisions_total={decided:g} loadaware_fallbacks_total={fallbacks:g}", flush=True)
    match_fraction = [s for s in metrics_text.samples(metrics)
                      if s.name.startswith("loadaware_prefix_match_fraction")]
    for sample in match_fraction[:4]:
        print(f"   /metrics: {metrics_text.format_sample(sample)}", flush=True)
    demo.check(fallbacks == 0, f"no fallbacks during the whole run (loadaware_fallbacks_total={fallbacks:g})")
    demo.facts["fallbacks"] = f"{fallbacks:g}"

    state: dict[str, Any] = {}

    async def drained() -> bool:
        nonlocal state
        state = await demo.get_json(f"{demo.debug_url}/debug/state")
        return int(state["inflight_total"]) == 0

    await demo.wait_for("in-flight counts back at 0", drained, timeout=3.0)
    per = {demo.name(e["endpoint"]): e["inflight"] for e in state.get("endpoints", [])}
    total = int(state.get("inflight_total", -1))
    running = {}
    for name, url in sorted(demo.urls.items()):
        st = await demo.get_json(f"{url}/sim/state")
        running[name] = int(st["running"]) + int(st["waiting"])
    print(f"   sidecar in-flight after the burst: total={total} {per}; "
          f"engines running+waiting: {running}", flush=True)
    demo.check(total == 0 and not any(running.values()), "in-flight back at 0 everywhere")
    demo.facts["inflight"] = str(total)
