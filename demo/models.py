"""Step 8 of the demo: two models behind one gateway.

A scratch trio on free addresses (files in the log directory): three more simulated engines in this process,
two serving model-a and one serving model-b (also named b-chat) with a LoRA adapter b-sql; a sidecar that reads
their /v1/models; an Envoy (envoy/envoy.yaml, BUFFERED) in front. The request's model selects its engines:
model-a's requests spread over model-a's two engines, model-b's and the adapter's all land on model-b's engine,
and a model nobody serves gets vLLM's 404 from the gateway without reaching any engine.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from demo.picker import start
from demo.session import DemoSession, debug_url_of, heading
from sim.fleet import start_fleet
from sim.models import parse_fleet_models
from testkit.envoy import EnvoyProc
from testkit.envoy_eds import eds_config, write_assignment
from testkit.paths import TINY_TOKENIZER
from testkit.ports import free_ports
from testkit.sidecar import SidecarProc

SPEC = "model-a;model-a;model-b,b-chat+b-sql=/loras/sql"
NAMES = ["a-0", "a-1", "b-0"]
BASE_IP = "127.0.0.12"  # away from the demo's fleet (127.0.0.2-4); each engine takes a free port
SENT = ["model-a"] * 6 + ["model-b"] * 2 + ["b-sql"] * 2  # at once: in-flight counts spread model-a's


async def two_models(demo: DemoSession) -> None:
    heading(8, "two models behind one gateway: the request's model selects its engines")
    t0 = time.monotonic()
    out = demo.stack.log_dir / "models"
    (out / "eds").mkdir(parents=True, exist_ok=True)
    fleet = await start_fleet(3, base_ip=BASE_IP, port=0, tokenizer=demo.tok, names=NAMES,
                              models=parse_fleet_models(SPEC, 3))
    endpoints = {f"{e.ip}:{e.port}": e.name for e in fleet.engines}
    grpc_port, metrics_port, listen, admin = free_ports(4)
    sidecar = SidecarProc(["--listen", f"127.0.0.1:{grpc_port}", "--endpoints", ",".join(endpoints),
                           "--metrics-listen", f"127.0.0.1:{metrics_port}", "--tokenizer", str(TINY_TOKENIZER),
                           "--models-refresh-s", "1", "--log-level", "WARNING"], log_dir=out)
    write_assignment(out / "eds", [(ep, "HEALTHY") for ep in endpoints], 1)
    envoy = EnvoyProc(eds_config(out / "eds", listen_port=listen, admin_port=admin, sidecar_port=grpc_port), out)
    debug_url = debug_url_of(sidecar, f"http://127.0.0.1:{metrics_port}")
    try:
        await asyncio.gather(start(sidecar), start(envoy))

        async def models_known() -> bool:
            state = await demo.get_json(f"{debug_url}/debug/state")
            return all(row["models"] for row in state["endpoints"])

        await demo.wait_for("the sidecar reads every engine's /v1/models", models_known)
        print(f"   scratch engines, sidecar and Envoy {envoy.url} up in {time.monotonic() - t0:.1f}s "
              f"(files in {out}); what the sidecar read from each engine's /v1/models:", flush=True)
        for row in (await demo.get_json(f"{debug_url}/debug/state"))["endpoints"]:
            m = row["models"]
            adapters = ", ".join(f"{k} (LoRA on {v})" for k, v in m["adapters"].items()) or "-"
            print(f"     {endpoints[row['endpoint']]:>4} {row['endpoint']:<22} models {', '.join(m['models'])}; "
                  f"adapters {adapters}", flush=True)
        await _route_by_model(demo, envoy, endpoints)
    finally:
        await asyncio.gather(asyncio.to_thread(envoy.stop), asyncio.to_thread(sidecar.stop))
        await fleet.stop()


async def _post(demo: DemoSession, url: str, model: str, i: int) -> tuple[int, str, str]:
    body = {"model": model, "prompt": f"request {i} for {model}: summarize the gateway's routing", "max_tokens": 16}
    async with demo.session.post(f"{url}/v1/completions", json=body) as resp:
        return resp.status, resp.headers.get("x-served-by", "?"), await resp.text()


def _upstream(envoy: EnvoyProc) -> int:
    return int(envoy.stats().get("cluster.engines.upstream_rq_total", 0))


async def _route_by_model(demo: DemoSession, envoy: EnvoyProc, endpoints: dict[str, str]) -> None:
    replies = await asyncio.gather(*(_post(demo, envoy.url, model, i) for i, model in enumerate(SENT)))
    served: dict[str, Counter[str]] = {}
    for model, (status, by, _) in zip(SENT, replies):
        served.setdefault(model, Counter())[by if status == 200 else f"HTTP {status}"] += 1
    for model, counts in served.items():
        spread = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
        print(f"   {counts.total()} x {model:<8} served by {spread}", flush=True)
    a_ok = set(served["model-a"]) == {"a-0", "a-1"}
    b_ok = all(served[m] == Counter({"b-0": SENT.count(m)}) for m in ("model-b", "b-sql"))
    demo.check(a_ok, "model-a's requests spread over model-a's two engines, and only them")
    demo.check(b_ok, "every model-b and b-sql (its LoRA adapter) request served by model-b's engine")
    before = await asyncio.to_thread(_upstream, envoy)
    status, _, text = await _post(demo, envoy.url, "gpt-nope", 0)
    reached = await asyncio.to_thread(_upstream, envoy) - before
    print(f"   model gpt-nope (no engine serves it): HTTP {status} from the gateway {text.strip()}\n"
          f"   requests Envoy sent to any engine for it: {reached}", flush=True)
    notfound = status == 404 and '"NotFoundError"' in text
    demo.check(notfound and reached == 0, "an unknown model gets vLLM's 404 from the gateway, reaching no engine")
    facts: dict[str, Any] = {"a": "+".join(sorted(served["model-a"])), "b": "+".join(sorted(served["model-b"])),
                             "sql": "+".join(sorted(served["b-sql"])), "unknown": status, "reached": reached}
    demo.facts["models"] = " ".join(["ok" if a_ok and b_ok and notfound and not reached else "failed",
                                     *(f"models_{k}={v}" for k, v in facts.items())])
