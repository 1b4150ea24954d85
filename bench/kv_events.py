"""The KV-events decision path, measured in-process (no sockets): what one decision and one event cost.

    python -m bench.kv_events [--quick]

- decision: CPU per lookup of a 1,578-token prompt (a 1,544-token shared prefix + a unique 34-token suffix)
  against 64 engines, each holding a share of 128 hot prefixes (several holders per prefix), then the
  loadaware policy over the 64 candidates. Targets: <= 1 ms CPU per decision.
- ingest: CPU per block event, decoding vLLM-format msgpack batches and applying them to the index (stored
  runs of 16 blocks, removals, as an engine under churn sends them). Target: >= 50k block events/s, one core.
Times are process CPU (time.process_time), single-threaded.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Sequence
from typing import Any

import msgpack

from bench import inprocess_cli
from loadaware.policies import Candidate
from loadaware.policies.loadaware import LoadAware
from loadaware.prefix.blocks import BlockIndex, block_keys
from loadaware.prefix.kvevents.codec import decode_batch
from loadaware.prefix.kvevents.query import KvEventsPrefixSource
from loadaware.prefix.kvevents.sync import ApplyCounts, apply_batch

TARGETS = {"decision_cpu_us": 1000.0, "ingest_block_events_per_s": 50_000.0}
BS = 16
PREFIX_TOKENS, SUFFIX_TOKENS = 1544, 34  # 1,578 in all: the reference workload's prompt (experiment/README.md)


def _prefix(i: int) -> list[int]:
    rng = random.Random(i)
    return [rng.randrange(32_000) for _ in range(PREFIX_TOKENS)]


def build_fleet_index(engines: int = 64, prefixes: int = 128, holders: int = 4,
                      seed: int = 0) -> tuple[BlockIndex, list[str], list[list[int]]]:
    """Each prefix cached (with a few full-prompt suffix blocks) on `holders` engines picked at random."""
    rng = random.Random(seed)
    index = BlockIndex()
    names = [f"10.1.{i // 250}.{i % 250 + 1}:8000" for i in range(engines)]
    texts = [_prefix(p) for p in range(prefixes)]
    for p, tokens in enumerate(texts):
        for engine in rng.sample(names, holders):
            full = tokens + [rng.randrange(32_000) for _ in range(SUFFIX_TOKENS)]
            n = len(full) // BS
            hashes = [hash((engine, p, i, "h")) for i in range(n)]
            index.store(engine, hashes, None, full[:n * BS], BS, "GPU")
    return index, names, texts


def bench_decision(iterations: int) -> dict[str, Any]:
    index, names, texts = build_fleet_index()
    source = KvEventsPrefixSource(index)
    policy = LoadAware(beta=1.0)
    rng = random.Random(1)
    prompts = [t + [rng.randrange(32_000) for _ in range(SUFFIX_TOKENS)] for t in texts]
    loads = [float(rng.randrange(40)) for _ in names]
    endpoints = tuple(names)

    def one(prompt: Sequence[int]) -> int:
        matches = source.lookup(prompt, endpoints)
        candidates = [Candidate(ep, min(matches.get(ep, 0), len(prompt)), load) for ep, load in zip(endpoints, loads)]
        choice = policy.choose(len(prompt), candidates)
        assert choice is not None
        return choice.index

    for p in prompts[:16]:  # warm caches
        one(p)
    holders_seen = sum(len(source.lookup(p, endpoints)) for p in prompts) / len(prompts)
    t0 = time.process_time()
    for i in range(iterations):
        one(prompts[i % len(prompts)])
    decision_s = (time.process_time() - t0) / iterations
    t0 = time.process_time()
    for i in range(iterations):
        block_keys(prompts[i % len(prompts)], BS)
    keys_s = (time.process_time() - t0) / iterations
    t0 = time.process_time()
    for i in range(iterations):
        source.lookup(prompts[i % len(prompts)], endpoints)
    lookup_s = (time.process_time() - t0) / iterations
    return {"engines": len(names), "prefixes": len(texts), "prompt_tokens": len(prompts[0]),
            "indexed_blocks": index.total_blocks, "index_bytes_estimate": index.approx_bytes(),
            "holders_credited_per_prompt": round(holders_seen, 2), "iterations": iterations,
            "block_keys_us": keys_s * 1e6, "lookup_us": lookup_s * 1e6, "decision_cpu_us": decision_s * 1e6}


def churn_payloads(batches: int, seed: int = 2) -> tuple[list[bytes], int]:
    """vLLM-format batches of an engine under churn: each stores a 16-block run and removes an older one."""
    rng = random.Random(seed)
    payloads: list[bytes] = []
    live: list[list[int]] = []
    block_events = 0
    for b in range(batches):
        tokens = [rng.randrange(32_000) for _ in range(16 * BS)]
        hashes = [hash((b, i)) for i in range(16)]
        events: list[Any] = [["BlockStored", hashes, None, tokens, BS, None, "GPU", None]]
        block_events += len(hashes)
        if len(live) > 64:
            gone = live.pop(0)
            events.append(["BlockRemoved", gone, "GPU"])
            block_events += len(gone)
        live.append(hashes)
        payloads.append(msgpack.packb([time.time(), events, 0], use_bin_type=True))
    return payloads, block_events


def bench_ingest(batches: int) -> dict[str, Any]:
    payloads, block_events = churn_payloads(batches)
    index = BlockIndex()
    counts = ApplyCounts()
    t0 = time.process_time()
    for payload in payloads:
        apply_batch(index, "10.1.0.1:8000", decode_batch(payload).events, counts)
    total_s = time.process_time() - t0
    assert counts.block_events == block_events
    t0 = time.process_time()
    for payload in payloads:
        decode_batch(payload)
    decode_s = time.process_time() - t0
    return {"batches": batches, "block_events": block_events, "cpu_s": total_s,
            "block_events_per_s": block_events / total_s, "us_per_block_event": total_s / block_events * 1e6,
            "decode_share": decode_s / total_s, "indexed_blocks_after": index.total_blocks}


def run(quick: bool = False) -> dict[str, Any]:
    decision = bench_decision(300 if quick else 3000)
    ingest = bench_ingest(500 if quick else 5000)
    return {"decision": decision, "ingest": ingest, "targets": TARGETS,
            "meets": {"decision": decision["decision_cpu_us"] <= TARGETS["decision_cpu_us"],
                      "ingest": ingest["block_events_per_s"] >= TARGETS["ingest_block_events_per_s"]}}


def table(result: dict[str, Any]) -> str:
    d, i = result["decision"], result["ingest"]
    ok = result["meets"]
    return "\n".join([
        "### 4. KV-events decision path (in-process, one core)\n",
        "| measure | value | target |", "|---|---|---|",
        f"| CPU per decision, {d['prompt_tokens']}-token prompt, {d['engines']} engines (keys + walk + "
        f"loadaware) | {d['decision_cpu_us']:,.0f} µs | ≤ 1,000 µs {'✅' if ok['decision'] else '❌'} |",
        f"| of which block keys ({d['prompt_tokens'] // BS} blocks) | {d['block_keys_us']:,.0f} µs | |",
        f"| of which keys + index walk | {d['lookup_us']:,.0f} µs | |",
        f"| holders credited per prompt | {d['holders_credited_per_prompt']} | every holder |",
        f"| index: {d['indexed_blocks']:,} blocks | ~{d['index_bytes_estimate'] / 2**20:,.1f} MiB | bounded |",
        f"| ingest (decode + apply) | {i['block_events_per_s']:,.0f} block events/s "
        f"({i['us_per_block_event']:.2f} µs each, {i['decode_share']:.0%} decoding) | ≥ 50,000/s "
        f"{'✅' if ok['ingest'] else '❌'} |",
        ""])


def main(argv: Sequence[str] | None = None) -> int:
    return inprocess_cli.main("python -m bench.kv_events", __doc__, run, table, argv)


if __name__ == "__main__":
    sys.exit(main())
