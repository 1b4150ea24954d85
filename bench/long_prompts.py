"""Case `long_prompts`: what a long prompt costs on its way through the gateway, against the same requests sent
straight to the engines.

Engines that cost almost nothing (`bench.null_engine`: the body read, one SSE event back at once) on the shipped
engine addresses; the sidecar as shipped with the tiny tokenizer (the default policy, the approximate prefix
source); two Envoys in front: envoy/envoy.yaml (BUFFERED) and envoy/envoy-inference-pool.yaml (the picker's
FULL_DUPLEX_STREAMED). For each prompt size and concurrency, `requests` completions (`"stream": true`,
`max_tokens` 1, every prompt different) in a closed loop at that concurrency, per arm:

    direct        straight to the engines (round robin)
    buffered      Envoy BUFFERED + sidecar
    full_duplex   Envoy FULL_DUPLEX_STREAMED + sidecar

Printed per cell: TTFT p50 and p99 (to the first SSE event) per arm and added over `direct`; the sidecar's CPU
per request (utime + stime of its process over the arm) and its decision stages' wall time per request (parse,
tokenize, lookup, score: the rest of the CPU is the body's way through gRPC and the event loop); the sidecar's
peak RSS (VmHWM) at the end.

    python -m bench.long_prompts [--quick] [--sizes-kb 50,220,500] [--concurrency 50,150] [--requests 300]
        [--cases distinct,conversation,new_user] [--sessions 150] [--turns 10]

Two more cases beside these distinct prompts (`--cases`, bench/long_sessions.py tells them in full):

    conversation  chat sessions growing turn by turn to 220 KB, each request the whole history plus a new turn,
                  150 sessions at once, through BUFFERED and the picker against direct (null engines); the
                  sidecar's conversation token cache sized for them (--conversation-cache-mb 128)
    new_user      as a new user would try it: 8 shared 220 KB documents, a question of its own per request,
                  concurrency 150, on three fast simulated engines (sim.fleet, which tokenize every prompt)
                  through the shipped BUFFERED Envoy against the same requests sent direct; what the gateway
                  adds to the direct p99

Everything binds the shipped loopback addresses under testkit's loopback lock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from testkit.envoy import EnvoyProc
from testkit.loopback_lock import loopback_lock
from testkit.metrics_text import metric_sum
from testkit.paths import ENVOY_CONFIG, REPO, TINY_TOKENIZER, python, repo_env
from testkit.ports import SIDECAR_PORT, free_port
from testkit.procs import ManagedProc
from testkit.sidecar import SidecarProc

from .stats import percentile

log = logging.getLogger("bench.long_prompts")

POOL_CONFIG = REPO / "envoy" / "envoy-inference-pool.yaml"
ENGINES = ("127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000")  # the shipped configs' engine addresses
STAGES = ("parse", "tokenize", "lookup", "score")
WORDS = ("context retrieval document passage answer question agent tool result summary table figure section "  # noqa: SIM905
         "paragraph citation source evidence claim model prompt token cache prefix engine").split()
CLIENT_TIMEOUT_S = 120.0


class NullEngines(ManagedProc):
    name = "null-engines"

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        argv = [python(), "-u", "-m", "bench.null_engine"]
        for ep in ENGINES:
            argv += ["--listen", ep]
        super().__init__(argv, log_dir, env=repo_env(), cwd=REPO)

    def _is_ready(self) -> bool:
        return any(line.startswith("READY ") for line in self.log_path.read_text(errors="replace").splitlines())


@dataclass
class ArmFigures:
    arm: str
    ttft_s: list[float] = field(default_factory=list)
    errors: int = 0
    sidecar_cpu_s: float = 0.0
    stage_s: dict[str, float] = field(default_factory=dict)

    def summary(self, n: int) -> dict[str, Any]:
        ok = sorted(self.ttft_s)
        return {"arm": self.arm, "ok": len(ok), "errors": self.errors,
                "ttft_p50_s": percentile(ok, 50) if ok else None, "ttft_p99_s": percentile(ok, 99) if ok else None,
                "sidecar_cpu_ms_per_request": self.sidecar_cpu_s / n * 1e3 if n else None,
                "stage_ms_per_request": {k: v / n * 1e3 for k, v in self.stage_s.items() if k in STAGES} if n else {},
                "untokenized": {k: int(v) for k, v in self.stage_s.items() if k in FALLBACKS}}


def prompt_of(size_bytes: int, n: int) -> str:
    """About `size_bytes` of words, different for every request (a number first: no shared prefix)."""
    rng = random.Random(n)
    words = [f"request {n}:"]
    total = len(words[0])
    while total < size_bytes:
        w = rng.choice(WORDS)
        words.append(w)
        total += len(w) + 1
    return " ".join(words)


def body(size_bytes: int, n: int) -> bytes:
    return json.dumps({"model": "tiny-model", "prompt": prompt_of(size_bytes, n), "max_tokens": 1,
                       "stream": True}).encode()


async def one(http: aiohttp.ClientSession, url: str, data: bytes, figures: ArmFigures) -> None:
    started = time.monotonic()
    try:
        async with http.post(url, data=data, headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                await resp.read()
                figures.errors += 1
                return
            first = None
            async for _ in resp.content.iter_any():
                if first is None:
                    first = time.monotonic() - started
            if first is not None:
                figures.ttft_s.append(first)
    except (aiohttp.ClientError, TimeoutError):
        figures.errors += 1


async def closed_loop(urls: list[str], size_bytes: int, concurrency: int, requests: int, first_n: int,
                      figures: ArmFigures) -> None:
    bodies = [body(size_bytes, first_n + i) for i in range(requests)]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as http:
        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await one(http, urls[i % len(urls)], bodies[i], figures)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


FALLBACKS = ("tokenizer_busy", "tokenizer_timeout")  # decisions made without the prompt's tokens


def stage_sums(sidecar: SidecarProc) -> dict[str, float]:
    text = sidecar.metrics_text()
    out = {s: metric_sum(text, "loadaware_decision_stage_seconds_sum", {"stage": s}) for s in STAGES}
    out.update({r: metric_sum(text, "loadaware_fallbacks_total", {"reason": r}) for r in FALLBACKS})
    return out


@contextmanager
def gateway(log_dir: Path, sidecar_args: Sequence[str] = (), path: str = "/v1/completions",
            engines: Callable[[Path], ManagedProc] = NullEngines
            ) -> Iterator[tuple[SidecarProc, dict[str, list[str]]]]:
    """The engines (`engines(log_dir)`: null engines unless told), the sidecar (the shipped flags plus
    `sidecar_args`) and both Envoys; each arm's URLs for `path`."""
    with loopback_lock(), engines(log_dir) as _engines, \
            SidecarProc(["--listen", f"127.0.0.1:{SIDECAR_PORT}", "--metrics-listen", f"127.0.0.1:{free_port()}",
                         "--endpoints", ",".join(ENGINES), "--tokenizer", str(TINY_TOKENIZER),
                         "--log-level", "warning", *sidecar_args], log_dir=log_dir) as sidecar, \
            EnvoyProc(ENVOY_CONFIG, log_dir / "envoy-buffered") as buffered, \
            EnvoyProc(POOL_CONFIG, log_dir / "envoy-picker") as picker:
        urls = {"direct": [f"http://{ep}{path}" for ep in ENGINES],
                "buffered": [f"{buffered.url}{path}"], "full_duplex": [f"{picker.url}{path}"]}
        yield sidecar, urls


def run(out_dir: Path, sizes_kb: list[int], concurrency: list[int], requests: int) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = []
    with gateway(out_dir / "logs") as (sidecar, urls):
        assert sidecar.proc is not None
        pid = sidecar.proc.pid
        n = 0
        for size_kb in sizes_kb:
            for conc in concurrency:
                arms = {}
                for arm in ("direct", "buffered", "full_duplex"):
                    figures = ArmFigures(arm)
                    cpu0, stages0 = cpu_seconds(pid), stage_sums(sidecar)
                    asyncio.run(closed_loop(urls[arm], size_kb * 1024, conc, requests, n, figures))
                    n += requests
                    if arm != "direct":
                        figures.sidecar_cpu_s = cpu_seconds(pid) - cpu0
                        figures.stage_s = {k: v - stages0[k] for k, v in stage_sums(sidecar).items()}
                    arms[arm] = figures.summary(requests)
                    log.info("%d KB x %d, %s: %s", size_kb, conc, arm, json.dumps(arms[arm]))
                direct = arms["direct"]
                for arm in ("buffered", "full_duplex"):
                    a = arms[arm]
                    for q in ("p50", "p99"):
                        mine, base = a[f"ttft_{q}_s"], direct[f"ttft_{q}_s"]
                        a[f"added_{q}_s"] = mine - base if mine is not None and base is not None else None
                cells.append({"size_kb": size_kb, "concurrency": conc, "requests": requests, "arms": arms})
        result: dict[str, Any] = {"cells": cells, "sidecar_peak_rss_mib": peak_rss_mib(pid)}
    result["loop_holds"] = loop_holds(sizes_kb)
    (out_dir / "long_prompts.json").write_text(json.dumps(result, indent=2))
    return result


def loop_holds(sizes_kb: list[int], streams: int = 20) -> dict[str, dict[str, float]]:
    """In process (no transport): the sidecar's event loop, `streams` BUFFERED conversations of each prompt size
    at once; the loop thread's CPU time in each loop callback (bench.fleet_size's Holds), max and p99. What a long
    prompt holds the loop for, whatever threads do beside it."""
    from loadaware.app import Sidecar
    from loadaware.config import from_args

    from .fleet_size import Holds

    out: dict[str, dict[str, float]] = {}
    for size_kb in sizes_kb:
        app = Sidecar(from_args(["--endpoints", ",".join(ENGINES), "--metrics-listen", "off",
                                 "--tokenizer", str(TINY_TOKENIZER)], environ={}))
        bodies = [body(size_kb * 1024, 10_000_000 + i) for i in range(streams)]
        holds = Holds()

        asyncio.run(_conversations(app, bodies, holds))
        samples = sorted(holds.window()) or [0.0]
        out[f"{size_kb} KB"] = {"max_ms": samples[-1] * 1e3,
                                "p99_ms": samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e3}
    return out


async def _conversations(app: Any, bodies: list[bytes], holds: Any) -> None:
    from .extproc_inprocess import Feed, buffered_messages

    await asyncio.gather(*(app.extproc.process(None, Feed(buffered_messages(b))) for b in bodies[:2]))
    holds.install()  # after a warm-up pair: first-use costs (imports, the tokenizer's caches) aside
    try:
        await asyncio.gather(*(app.extproc.process(None, Feed(buffered_messages(b))) for b in bodies[2:]))
    finally:
        holds.uninstall()


def table(result: dict[str, Any]) -> str:
    lines = ["### Long prompts: added TTFT and the sidecar's cost (null engines; closed loop)", "",
             "| prompt | concurrency | direct p50 / p99 | BUFFERED added p50 / p99 | full duplex added p50 / p99 | "
             "sidecar CPU per request (BUFFERED / duplex) | stages per request (BUFFERED: parse, tokenize, "
             "lookup, score) | decided without tokens: busy / timeout (BUFFERED, duplex) | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        d, b, f = c["arms"]["direct"], c["arms"]["buffered"], c["arms"]["full_duplex"]
        stages = ", ".join(f"{b['stage_ms_per_request'].get(s, 0):.1f}" for s in STAGES)
        lines.append(
            f"| {c['size_kb']} KB | {c['concurrency']} | {_ms(d['ttft_p50_s'])} / {_ms(d['ttft_p99_s'])} | "
            f"{_ms(b.get('added_p50_s'))} / {_ms(b.get('added_p99_s'))} | "
            f"{_ms(f.get('added_p50_s'))} / {_ms(f.get('added_p99_s'))} | "
            f"{b['sidecar_cpu_ms_per_request']:.1f} / {f['sidecar_cpu_ms_per_request']:.1f} ms | {stages} ms | "
            f"{_untokenized(b)}, {_untokenized(f)} | "
            f"{d['errors']} / {b['errors']} / {f['errors']} |")
    lines += ["", f"- the sidecar's peak RSS: {result['sidecar_peak_rss_mib']:.0f} MiB"]
    for size, hold in result.get("loop_holds", {}).items():
        lines.append(f"- the event loop held by one callback, {size} prompts (in process, 18 at once): max "
                     f"{hold['max_ms']:.1f} ms, p99 {hold['p99_ms']:.1f} ms (bound: 10 ms)")
    lines.append("")
    return "\n".join(lines)


def _untokenized(arm: dict[str, Any]) -> str:
    counts = arm.get("untokenized", {})
    return " / ".join(str(counts.get(r, 0)) for r in FALLBACKS)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:+.0f} ms" if value < 0 else f"{value * 1e3:.0f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.long_prompts", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes and counts (the smoke test in make test)")
    p.add_argument("--sizes-kb", default="50,220,500")
    p.add_argument("--concurrency", default="50,150")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--out", default="out/bench-long-prompts")
    p.add_argument("--cases", default="distinct",
                   help="comma-separated: distinct (every prompt different), conversation, new_user "
                        "(bench/long_sessions.py)")
    p.add_argument("--sessions", type=int, default=150, help="conversation: sessions at once")
    p.add_argument("--turns", type=int, default=10, help="conversation: measured turns per session")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    cases = set(args.cases.split(","))
    if "distinct" in cases:
        if args.quick:
            result = run_case(Path(args.out), quick=True)
        else:
            result = run(Path(args.out), [int(x) for x in args.sizes_kb.split(",")],
                         [int(x) for x in args.concurrency.split(",")], args.requests)
        print(table(result))
    if cases & {"conversation", "new_user"}:
        print(sessions_case(Path(args.out), cases, args.sessions, args.turns))
    return 0


def sessions_case(out_dir: Path, cases: set[str], sessions: int, turns: int) -> str:
    """The conversation and new-user cases (bench/long_sessions.py); their tables."""
    from . import long_sessions

    result: dict[str, Any] = {}
    if "conversation" in cases:
        shape = long_sessions.ConversationShape(sessions=sessions, turns=turns)
        result["conversation"] = long_sessions.run_conversation(out_dir, shape)
    if "new_user" in cases:
        result["new_user"] = long_sessions.run_new_user(out_dir)
    (out_dir / "long_sessions.json").write_text(json.dumps(result, indent=2))
    return long_sessions.tables(result)


def run_case(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    """`make bench`'s case `long_prompts`: the full form (50, 220 and 500 KB x 50 and 150, 300 requests), or with
    `quick` the smoke test's small one (8 and 32 KB x 8, 24 requests)."""
    if quick:
        return run(out_dir, [8, 32], [8], 24)
    return run(out_dir, [50, 220, 500], [50, 150], 300)


if __name__ == "__main__":
    raise SystemExit(main())
