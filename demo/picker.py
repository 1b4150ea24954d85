"""Step 7 of the demo: the Endpoint Picker Protocol (issue 10) on the same running stack.

A second Envoy on envoy/envoy-inference-pool.yaml (ext_proc FULL_DUPLEX_STREAMED, as Istio configures an
InferencePool's endpoint picker; listener :10001, fail closed) in front of the same sidecar (:9002) and the same
engines, while Envoy :10000 (BUFFERED) stays up: the sidecar tells the modes apart from what Envoy sends. For each
request through :10001 the step prints the ranked list the sidecar named (its decision record), the engine that
served (`x-served-by`), the served endpoint in the sidecar's record, and for a stream that the SSE arrived whole;
then that nothing is left in flight.

Then a retry walking the ranked list. Nothing the demo's sidecar can name refuses a connection: it knows the three
live engines, which run in one process. So a scratch pair shows it, written to the log directory: a copy of the
config whose pool has a fourth host where nothing listens (an engine that just died) and a second sidecar whose
fleet lists that host. Its scrape fails, so the sidecar counts only its own in-flight requests there (0) while
the live engines report BUSY_RUNNING running: it ranks the dead host first (its unreachable-engine ejection is
turned off for this: step 9 shows failure-aware routing). Envoy's connection is refused, the
retry takes the next entry of the list, and the served endpoint Envoy reports moves the sidecar's count there.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from demo.explain import EngineName, explain
from demo.prompts import MODEL, prefix_text, summarize
from demo.session import DemoFailure, DemoSession, Reply, debug_url_of, heading
from loadaware.fleet.addresses import parse_hostport
from testkit.envoy import EnvoyProc
from testkit.paths import REPO, TINY_TOKENIZER
from testkit.ports import SIDECAR_PORT, accepts, free_port, free_ports
from testkit.procs import ManagedProc, ProcError
from testkit.sidecar import SidecarProc

PICKER_CONFIG = REPO / "envoy" / "envoy-inference-pool.yaml"
PICKER_LISTEN_PORT = 10001  # PICKER_CONFIG's listener and admin ports (envoy.yaml has 10000 and 9901)
PICKER_ADMIN_PORT = 9911
DEAD_IP = "127.0.0.9"  # outside the demo's fleet (127.0.0.2-4); the port is checked to refuse before use
MAX_TOKENS = 12
STREAM_TOKENS = 64  # ~0.3 s of streaming: long enough to look at the in-flight counts while it runs
STREAMED: dict[str, Any] = {"max_tokens": STREAM_TOKENS, "stream": True, "stream_options": {"include_usage": True}}
BUSY_RUNNING = 4  # what the live engines report while the dead host is on the list
FALLBACK_ENDPOINTS = 2  # the sidecar's default --fallback-endpoints: a list of the choice + 2


# ---- what came back ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sse:
    """A streamed completion as the client received it."""

    events: int  # `data:` events, [DONE] included
    tokens: int  # events that carry a generated token
    finish: str | None  # the last token's finish_reason
    usage: int | None  # completion_tokens of the usage event
    done_last: bool  # exactly one `data: [DONE]`, as the last event

    def whole(self, max_tokens: int) -> bool:
        return (self.done_last and self.tokens == max_tokens and self.finish == "length"
                and self.usage == self.tokens)

    def describe(self) -> str:
        return (f"{self.events} events ({self.tokens} tokens, last finish_reason {self.finish}, usage "
                f"{self.usage} tokens, {'[DONE] last' if self.done_last else 'NO [DONE] at the end'})")


def parse_sse(text: str) -> Sse:
    datas = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    tokens, finish, usage = 0, None, None
    for data in datas:
        if data == "[DONE]":
            continue
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if event.get("usage"):
            usage = int(event["usage"].get("completion_tokens", -1))
        for choice in event.get("choices") or []:
            if "role" in (choice.get("delta") or {}):
                continue  # a chat stream's opening event: the assistant role, no token
            tokens += 1
            finish = choice.get("finish_reason")
    return Sse(len(datas), tokens, finish, usage, bool(datas) and datas[-1] == "[DONE]" and datas.count("[DONE]") == 1)


@dataclass
class Outcome:
    reply: Reply
    decision: dict[str, Any]
    sse: Sse | None  # streams only
    cut: str  # why the body did not arrive whole ("" if it did)
    mid: dict[str, int] | None  # streams: the sidecar's in-flight per endpoint once the first event arrived
    max_tokens: int  # as asked


async def inflight(demo: DemoSession, debug_url: str) -> dict[str, int]:
    """The sidecar's in-flight count per endpoint (GET /debug/state)."""
    state = await demo.get_json(f"{debug_url}/debug/state")
    return {str(e["endpoint"]): int(e["inflight"]) for e in state["endpoints"]}


async def send_one(demo: DemoSession, base_url: str, path: str, body: dict[str, Any], label: str,
                   debug_url: str) -> Outcome:
    """POST through the Envoy at `base_url`, reading the body as it comes (a body cut short is reported, not
    raised); a stream's first event is followed by a look at the in-flight counts of the sidecar at
    `debug_url`, while the request still runs."""
    print(f"   POST {path}{' stream' if body.get('stream') else ''} {label}", flush=True)
    request_id = demo.new_request_id()
    mid: dict[str, int] | None = None
    chunks: list[bytes] = []
    cut = ""
    async with demo.session.post(f"{base_url}{path}", json=body, headers={"x-request-id": request_id},
                                 timeout=aiohttp.ClientTimeout(total=30)) as resp:
        try:
            async for chunk in resp.content.iter_any():
                chunks.append(chunk)
                if mid is None and body.get("stream") and resp.status == 200:
                    mid = await inflight(demo, debug_url)
        except aiohttp.ClientPayloadError as e:
            cut = f"the response body was cut short ({e})"
        reply = Reply(resp.status, resp.headers.get("x-served-by", "?"), request_id,
                      b"".join(chunks).decode(errors="replace"))
    decision = await demo.decision_for(reply.request_id, debug_url)
    sse = parse_sse(reply.text) if body.get("stream") and reply.status == 200 else None
    return Outcome(reply, decision, sse, cut, mid, int(body["max_tokens"]))


def ranked_text(d: dict[str, Any], name: EngineName) -> str:
    scores = {c["endpoint"]: float(c["score"]) for c in d["candidates"]}
    return " > ".join(f"{name(ep)} {scores[ep]:+.3f}" if ep in scores else name(ep) for ep in d["ranked"])


def check_stream(demo: DemoSession, o: Outcome, name: EngineName) -> bool:
    """The in-flight count sat on the engine that served while the stream ran; the stream arrived whole."""
    if o.sse is None or o.mid is None:
        return demo.check(False, f"a streamed response (HTTP {o.reply.status}{'; ' + o.cut if o.cut else ''})")
    served = o.decision["served"]
    print(f"      mid-stream, the sidecar's in-flight: {', '.join(f'{name(ep)} {n}' for ep, n in o.mid.items())}",
          flush=True)
    demo.check(o.mid.get(served) == 1 and sum(o.mid.values()) == 1,
               f"while it streamed, its one in-flight count sat on the engine that served ({name(served)})")
    print(f"      SSE: {o.sse.describe()}{'; ' + o.cut if o.cut else ''}", flush=True)
    return demo.check(o.sse.whole(o.max_tokens) and not o.cut,
                      f"the stream arrived whole ({o.sse.tokens}/{o.max_tokens} tokens, finish_reason "
                      f"{o.sse.finish}, [DONE] {'last' if o.sse.done_last else 'missing'})")


def envoy_stats(envoy: EnvoyProc) -> dict[str, float]:
    """The few Envoy counters the step shows, by short name."""
    stats = envoy.stats()

    def one(suffix: str) -> float:
        return float(sum(v for k, v in stats.items() if k.endswith(suffix)))

    return {"ext_proc_started": one(".ext_proc.streams_started"), "ext_proc_failed": one(".ext_proc.streams_failed"),
            "rq_total": one("cluster.engines.upstream_rq_total"),
            "connect_fail": one("cluster.engines.upstream_cx_connect_fail"),
            "retry": one("cluster.engines.upstream_rq_retry"),
            "retry_success": one("cluster.engines.upstream_rq_retry_success")}


async def drained(demo: DemoSession, debug_url: str, what: str) -> dict[str, Any]:
    """Wait for the sidecar at `debug_url` to have nothing in flight and no ext_proc stream open; its state."""
    state: dict[str, Any] = {}

    async def probe() -> bool:
        nonlocal state
        state = await demo.get_json(f"{debug_url}/debug/state")
        return int(state["inflight_total"]) == 0 and int(state["open_streams"]) == 0

    await demo.wait_for(f"{what}: in-flight back at 0 and no ext_proc stream open", probe, timeout=3.0)
    return state


async def start(proc: ManagedProc) -> None:
    try:
        await asyncio.to_thread(proc.start)
    except ProcError as e:
        raise DemoFailure(f"{proc.name} did not start: {e}") from None


# ---- the step ----------------------------------------------------------------------------------------------
async def picker_mode(demo: DemoSession) -> None:
    """Step 7: the picker mode through a second Envoy, then a retry walking the ranked list."""
    heading(7, "the Endpoint Picker Protocol: a second Envoy as a Gateway API InferencePool gateway")
    t0 = time.monotonic()
    print(f"   {PICKER_CONFIG.relative_to(REPO)}: Istio's InferencePool filter and cluster; listener "
          f"127.0.0.1:{PICKER_LISTEN_PORT}, ext_proc FULL_DUPLEX_STREAMED to the same sidecar "
          f"(127.0.0.1:{SIDECAR_PORT}), fail closed,\n   override_host reads the sidecar's ranked list from "
          f"envoy.lb metadata and the header, retries walk it. Envoy {demo.stack.url} (BUFFERED) stays up.",
          flush=True)
    envoy = EnvoyProc(PICKER_CONFIG, demo.stack.log_dir)
    try:
        await start(envoy)
        print(f"   second Envoy up at {envoy.url} in {time.monotonic() - t0:.1f}s "
              f"(log {envoy.log_path.name})", flush=True)
        await through_the_picker(demo, envoy)
    finally:
        envoy.stop()
    await retry_walks_the_list(demo)
    print(f"   step 7 took {time.monotonic() - t0:.1f}s", flush=True)


async def through_the_picker(demo: DemoSession, envoy: EnvoyProc) -> None:
    """Completions and chat, streamed and not, through the picker-mode Envoy."""
    tok = demo.tok
    hot = prefix_text(tok, 100, 1000)  # step 6's most popular prefix: an engine holds it
    system = prefix_text(tok, 101, 1000)
    plain: dict[str, Any] = {"max_tokens": MAX_TOKENS}
    jobs: list[tuple[str, dict[str, Any], str]] = []
    for k, extra in enumerate((plain, STREAMED)):
        prompt = f"{hot} picker request {k + 1}"
        jobs.append(("/v1/completions", {"model": MODEL, "prompt": prompt, **extra},
                     summarize(prompt, len(tok.encode_prompt(prompt)))))
    for k, extra in enumerate((plain, STREAMED)):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": f"picker request {k + 3}"}]
        jobs.append(("/v1/chat/completions", {"model": MODEL, "messages": msgs, **extra},
                     f"system {summarize(system, len(tok.encode_prompt(system)))} + user "
                     f"({len(tok.encode_chat(msgs))} tokens templated)"))
    ok = whole = 0
    lengths: set[int] = set()
    for path, body, label in jobs:
        o = await send_one(demo, envoy.url, path, body, label, demo.debug_url)
        d = o.decision
        lengths.add(len(d["ranked"]))
        print(f"   -> {o.reply.served_by} (HTTP {o.reply.status}); the sidecar ranked {ranked_text(d, demo.name)} "
              f"(sent as header and envoy.lb metadata); its record says served by {demo.name(d['served'])}", flush=True)
        first = demo.name(d["ranked"][0]) if d["ranked"] else "nobody"
        good = demo.check(o.reply.status == 200 and len(d["ranked"]) == 1 + FALLBACK_ENDPOINTS
                          and o.reply.served_by == first == demo.name(d["served"]),
                          f"HTTP {o.reply.status}, a list of {len(d['ranked'])} (choice + {FALLBACK_ENDPOINTS}), "
                          f"served by its first entry ({o.reply.served_by} == {first} == the record's "
                          f"{demo.name(d['served'])})")
        if body.get("stream"):
            whole += check_stream(demo, o, demo.name)
        elif o.cut:
            good = demo.check(False, o.cut)
        ok += good
    stats = envoy_stats(envoy)
    print(f"   Envoy {envoy.url}: ext_proc streams started {stats['ext_proc_started']:g}, failed "
          f"{stats['ext_proc_failed']:g}; engines cluster: {stats['rq_total']:g} requests, {stats['retry']:g} retries",
          flush=True)
    demo.check(stats["ext_proc_started"] == len(jobs) and stats["ext_proc_failed"] == 0,
               f"every request went through the picker ({stats['ext_proc_started']:g}/{len(jobs)} ext_proc streams, "
               f"{stats['ext_proc_failed']:g} failed)")
    state = await drained(demo, demo.debug_url, "the sidecar")
    total = int(state.get("inflight_total", -1))
    per = {demo.name(e["endpoint"]): e["inflight"] for e in state.get("endpoints", [])}
    print(f"   sidecar in-flight after the picker requests: total={total} {per}; open ext_proc streams "
          f"{state.get('open_streams')}", flush=True)
    demo.check(total == 0 and state.get("open_streams") == 0,
               "in-flight back at 0 on the sidecar, every ext_proc stream closed")
    n_stream = sum(1 for _, b, _ in jobs if b.get("stream"))
    demo.facts["picker"] = (f"{ok}/{len(jobs)} whole_streams={whole}/{n_stream} "
                            f"ranked_len={','.join(str(n) for n in sorted(lengths))} picker_inflight={total}")


def dead_address() -> str:
    """An address on DEAD_IP where nothing listens: a connection there is refused."""
    return f"{DEAD_IP}:8000" if not accepts(DEAD_IP, 8000) else f"{DEAD_IP}:{free_port(DEAD_IP)}"


def retry_config(dest: Path, dead: str, listen: int, admin: int, picker: int) -> Path:
    """PICKER_CONFIG with a fourth pool host `dead` and its own listener, admin and picker ports."""
    text = PICKER_CONFIG.read_text()
    last = "        - endpoint: {address: {socket_address: {address: 127.0.0.4, port_value: 8000}}}\n"
    host, port_number = parse_hostport(dead)
    port = str(port_number)
    edits = [(f"port_value: {PICKER_LISTEN_PORT}}}", f"port_value: {listen}}}"),
             (f"port_value: {PICKER_ADMIN_PORT}}}", f"port_value: {admin}}}"),
             (f"port_value: {SIDECAR_PORT}}}", f"port_value: {picker}}}"),
             (last, last + last.replace("127.0.0.4", host).replace("8000", port))]
    for old, new in edits:
        if text.count(old) != 1:
            raise DemoFailure(f"{PICKER_CONFIG.name} changed: expected one {old.strip()!r} to edit")
        text = text.replace(old, new)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "envoy-inference-pool-retry.yaml"
    path.write_text(f"# Written by `make demo` (step 7): {PICKER_CONFIG.relative_to(REPO)} with a fourth pool host "
                    f"{dead}, where nothing listens,\n# and listener {listen}, admin {admin}, picker {picker}.\n"
                    + text)
    return path


async def set_busy(demo: DemoSession, running: int, debug_url: str) -> None:
    """Phantom `running` on every live engine, until the sidecar at `debug_url` has scraped it."""
    for url in demo.urls.values():
        await demo.post_json(f"{url}/sim/phantom_load", {"running": running, "waiting": 0})

    async def seen() -> bool:
        state = await demo.get_json(f"{debug_url}/debug/state")
        got = {e["endpoint"]: e["scraped"] for e in state["endpoints"]}
        return all(got.get(ep) is not None and float(got[ep]["running"]) == running for ep in demo.names)

    await demo.wait_for(f"the sidecar scrapes running={running} on every live engine", seen)


async def retry_walks_the_list(demo: DemoSession) -> None:
    print("\n   -- a retry walking the ranked list", flush=True)
    dead = dead_address()
    out = demo.stack.log_dir / "picker-retry"
    grpc_port, metrics_port, listen, admin = free_ports(4)
    config = retry_config(out, dead, listen, admin, grpc_port)
    live = sorted(demo.names)
    print(f"   The sidecar above knows only the three live engines, which run in one process: nothing it can name\n"
          f"   refuses a connection. So a scratch pair shows it (files in {out}):\n"
          f"   - {config.name}: the shipped config plus a fourth pool host {dead} where nothing\n"
          f"     listens (an engine that just died); listener :{listen}, admin :{admin}, picker :{grpc_port};\n"
          f"   - a second sidecar on :{grpc_port} whose --endpoints list that host after the three engines.\n"
          f"   Its scrape of {dead} fails, so that sidecar counts only its own in-flight requests there (0), "
          f"while\n   the live engines report {BUSY_RUNNING} running each (/sim/phantom_load): it ranks the dead "
          f"host first.\n   (Its failing scrapes would take the dead host out of rotation at once, as step 9 shows "
          f"for a failing\n   engine; --unreachable-after-scrapes 0 turns that off here, so the retry has a host to "
          f"walk past.)", flush=True)
    sidecar = SidecarProc(["--listen", f"127.0.0.1:{grpc_port}", "--endpoints", ",".join([*live, dead]),
                           "--metrics-listen", f"127.0.0.1:{metrics_port}", "--tokenizer", str(TINY_TOKENIZER),
                           "--scrape-interval-s", "0.25", "--loadaware-beta", str(demo.beta),
                           "--unreachable-after-scrapes", "0", "--log-level", "WARNING"], log_dir=out)
    debug_url = debug_url_of(sidecar, f"http://127.0.0.1:{metrics_port}")
    envoy = EnvoyProc(config, out)
    busy = False
    try:
        await asyncio.gather(start(sidecar), start(envoy))
        busy = True
        await set_busy(demo, BUSY_RUNNING, debug_url)

        def name(ep: str | None) -> str:
            return "dead-host" if ep == dead else demo.name(ep)

        ok = 0
        served: list[str] = []
        prompt, user = prefix_text(demo.tok, 700, 200), prefix_text(demo.tok, 701, 200)
        jobs = [("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS},
                 summarize(prompt, len(demo.tok.encode_prompt(prompt)))),
                ("/v1/chat/completions", {"model": MODEL, **STREAMED, "messages": [{"role": "user", "content": user}]},
                 f"user {summarize(user, len(demo.tok.encode_prompt(user)))}")]
        for path, body, label in jobs:
            before = await asyncio.to_thread(envoy_stats, envoy)
            o = await send_one(demo, envoy.url, path, body, label, debug_url)
            after = await asyncio.to_thread(envoy_stats, envoy)
            d, r = o.decision, o.reply
            explain(d, r.served_by, r.status, name, demo.beta)
            ranked = list(d["ranked"])
            print(f"      ranked: {ranked_text(d, name)}; Envoy counted "
                  f"{after['connect_fail'] - before['connect_fail']:g} refused connect(s) and "
                  f"{after['retry'] - before['retry']:g} retry(ies) for it; {r.served_by} served; the sidecar's "
                  f"record now says served by {name(d['served'])}", flush=True)
            demo.check(bool(ranked) and ranked[0] == dead,
                       f"the sidecar ranked the dead host first (chose {name(d['endpoint'])})")
            second = name(ranked[1]) if len(ranked) > 1 else "nobody"
            good = demo.check(r.status == 200 and r.served_by == second == name(d["served"]),
                              f"HTTP {r.status} from the list's second entry after the refused first "
                              f"({r.served_by} == {second}), and Envoy's served report reached the sidecar "
                              f"(record: {name(d['served'])})")
            if body.get("stream"):
                good = check_stream(demo, o, name) and good
            elif o.cut:
                good = demo.check(False, o.cut)
            ok += good
            served.append(r.served_by)
        stats = envoy_stats(envoy)
        print(f"   Envoy {envoy.url}: engines cluster {stats['connect_fail']:g} refused connects, "
              f"{stats['retry']:g} retries, {stats['retry_success']:g} retried requests succeeded", flush=True)
        demo.check(stats["connect_fail"] == len(jobs) and stats["retry"] == len(jobs)
                   and stats["retry_success"] == len(jobs),
                   f"one refused connect and one successful retry per request ({len(jobs)})")
        state = await drained(demo, debug_url, "the second sidecar")
        total = int(state.get("inflight_total", -1))
        per = {name(e["endpoint"]): e["inflight"] for e in state.get("endpoints", [])}
        print(f"   second sidecar in-flight afterwards: total={total} {per}; open ext_proc streams "
              f"{state.get('open_streams')}", flush=True)
        demo.check(total == 0 and state.get("open_streams") == 0 and per.get("dead-host") == 0,
                   "in-flight back at 0 on the second sidecar, none left on the dead host")
        demo.facts["retry"] = (f"{ok}/{len(jobs)} first={dead} served={','.join(served)} "
                               f"connect_fails={stats['connect_fail']:g} retries={stats['retry']:g} "
                               f"retry_inflight={total}")
        print("   clearing the phantom load", flush=True)
        await set_busy(demo, 0, demo.debug_url)
        busy = False
    finally:
        envoy.stop()
        sidecar.stop()
        if busy:  # left by a failure above: the engines must not keep reporting phantom requests
            for url in demo.urls.values():
                try:
                    await demo.post_json(f"{url}/sim/phantom_load", {"running": 0, "waiting": 0})
                except (TimeoutError, aiohttp.ClientError):
                    pass
