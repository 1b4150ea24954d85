"""Multi-holder credit end to end: real Envoy, the real LMCache controller, the real sidecar, 3 simulated
engines publishing vLLM KV events alongside their LMCache reports.

Two engines hold a hot prefix. With the KV-events source both are credited, so under loadaware the traffic
follows whichever of them is less loaded. With stock LMCache only the first registered holder is credited, so
the same loads leave every request on it: its lookup walks 256-token chunks and credits each chunk to the
first registered instance holding it (docs/architecture.md, "Data sources and who owns which state"). Both
arms run in this one test run, on the same fleet and the same caches. Then a third holder is killed and
restarted: its credit goes with it.

Engine-2 runs in its own fleet process so that it can be killed on its own.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from loadaware.policies import Candidate
from loadaware.policies.loadaware import loadaware_scores
from testkit.fleet import FleetProc
from testkit.lmcache import LMCacheControllerProc
from testkit.metrics_text import metric_sum
from testkit.ports import free_port
from testkit.require import requires_lmcache
from testkit.sidecar import SidecarProc
from testkit.stack import Stack
from tests.conftest import wait_until

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "sim" / "assets" / "tiny-model"
WORDS = [
    "the", "engine", "cache", "prefix", "token", "model", "latency", "load", "balance", "router", "gateway",
    "envoy", "cluster", "query", "answer", "document", "context", "summary", "question", "policy", "score",
    "matched", "prompt", "decode", "prefill", "batch",
]
BETA = "0.5"

pytestmark = [pytest.mark.e2e, requires_lmcache()]


def hot_prefix(seed: int, words: int = 2000) -> str:
    # ~2,000 tokens: LMCache credits whole 256-token chunks, so its holder's benefit is ~0.9, not ~0.7
    return " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] for i in range(words)) + f" topic{seed}."


def http(method: str, url: str, body: Any = None, timeout: float = 20) -> tuple[int, dict[str, str], bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


class Rig:
    def __init__(self, stack: Stack, engine2: FleetProc, log_dir: Path) -> None:
        self.stack = stack
        self.engine2 = engine2
        self.log_dir = log_dir
        self.metrics_addr = f"127.0.0.1:{free_port()}"
        self.debug_addr = f"127.0.0.1:{free_port()}"  # /debug/* is on the admin HTTP listener
        self.tokenizer = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
        assert stack.fleet is not None
        self.engines = {e["name"]: f"{e['ip']}:{e['port']}" for e in [*stack.fleet.engines, *engine2.engines]}
        self.names = {ep: name for name, ep in self.engines.items()}
        self.sidecar: SidecarProc | None = None

    def start_sidecar(self, source: str) -> None:
        if self.sidecar is not None:
            self.sidecar.stop()
        assert self.stack.lmcache is not None
        args = ["--listen", "127.0.0.1:9002", "--endpoints", ",".join(self.engines.values()),
                "--tokenizer", str(TOKENIZER), "--metrics-listen", self.metrics_addr,
                "--admin-http-listen", self.debug_addr,
                "--lmcache-url", self.stack.lmcache.url, "--prefix-source", source,
                "--policy", "loadaware", "--loadaware-beta", BETA,
                "--scrape-interval-s", "0.2", "--scrape-stale-s", "2"]
        self.sidecar = SidecarProc(args, log_dir=self.log_dir).start(timeout=20)

    def debug(self, path: str) -> Any:
        return json.loads(http("GET", f"http://{self.debug_addr}{path}")[2])

    def routing_state(self, name: str) -> str:
        rows = {ep["endpoint"]: ep for ep in self.debug("/debug/state")["endpoints"]}
        return str(rows[self.engines[name]]["routing_health"]["state"])

    def kv_engine(self, name: str) -> dict[str, Any]:
        return self.debug("/debug/state")["prefix"]["kv_events"]["engines"][self.engines[name]]

    def phantom(self, **running: int) -> None:
        for name, n in running.items():
            http("POST", f"http://{self.engines[name]}/sim/phantom_load", {"running": n, "waiting": 0})

        def scraped_all() -> bool:
            seen = {ep["endpoint"]: ep["scraped"] for ep in self.debug("/debug/state")["endpoints"]}
            return all(seen.get(self.engines[n]) and seen[self.engines[n]]["running"] == v for n, v in running.items())

        wait_until(scraped_all, message=f"the sidecar's scrape to see the phantom loads {running}")

    def warm_directly(self, name: str, prompt: str) -> None:
        status, _, body = http("POST", f"http://{self.engines[name]}/v1/completions",
                               {"model": "tiny-model", "prompt": prompt, "max_tokens": 1})
        assert status == 200, body

    def route(self, prompt: str) -> tuple[str, dict[str, Any]]:
        status, headers, body = http("POST", self.stack.url + "/v1/completions",
                                     {"model": "tiny-model", "prompt": prompt, "max_tokens": 2})
        assert status == 200, body
        decision = self.debug("/debug/decisions?n=1")[-1]
        served = headers.get("x-served-by") or headers.get("X-Served-By")
        assert served and self.engines[served] == decision["endpoint"], (served, decision)
        return served, decision

    def matched(self, decision: dict[str, Any]) -> dict[str, int]:
        return {self.names[c["endpoint"]]: c["matched_tokens"] for c in decision["candidates"]}

    def lmcache_holders(self, prompt: str) -> list[str]:
        assert self.stack.lmcache is not None
        tokens = self.tokenizer.encode(prompt).ids
        _, _, body = http("POST", self.stack.lmcache.url + "/lookup", {"tokens": tokens})
        return list(json.loads(body)["layout_info"])


def assert_formula(decision: dict[str, Any]) -> None:
    cands = [Candidate(c["endpoint"], c["matched_tokens"], c["load"]) for c in decision["candidates"]]
    expected = loadaware_scores(decision["prompt_tokens"], cands, float(BETA))
    assert [c["score"] for c in decision["candidates"]] == pytest.approx(expected)


def start_engine2(log_dir: Path, lmcache: LMCacheControllerProc) -> FleetProc:
    return FleetProc(log_dir / "engine-2", engines=1, base_ip="127.0.0.4", lmcache=lmcache,
                     extra_args=["--kv-events", "--names", "engine-2"]).start()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    log_dir = tmp_path_factory.mktemp("e2e-multi-holder")
    stack = Stack(log_dir, engines=2, lmcache=True, fleet_args=["--kv-events"])
    stack.start()  # holds the loopback lock until stopped
    engine2: FleetProc | None = None
    r: Rig | None = None
    try:
        assert stack.lmcache is not None and stack.sidecar is not None
        stack.sidecar.stop()  # ours lists all three engines and picks its prefix source
        engine2 = start_engine2(log_dir, stack.lmcache)
        r = Rig(stack, engine2, log_dir)
        yield r
    finally:
        if r is not None:
            if r.sidecar is not None:
                r.sidecar.stop()
            r.engine2.stop()
        elif engine2 is not None:
            engine2.stop()
        stack.stop()


def test_every_holder_shares_hot_prefix_traffic_but_lmcache_credit_cannot(rig: Rig) -> None:
    prefix = hot_prefix(1)
    for name in ("engine-0", "engine-1"):
        rig.warm_directly(name, prefix + f" warm {name}?")
    wait_until(lambda: len(rig.lmcache_holders(prefix + " probe?")) == 1, message="LMCache credits the prefix")
    # stock LMCache: both engines hold every chunk, exactly one is credited (the first registered)
    (credited,) = rig.lmcache_holders(prefix + " probe?")
    other = "engine-1" if credited == "engine-0" else "engine-0"

    # ---- arm 1: the KV-events source credits both holders ----
    rig.start_sidecar("kv-events")
    wait_until(lambda: all(rig.kv_engine(n)["blocks"] > 100 and rig.kv_engine(n)["synced"] for n in (credited, other)),
               message="the KV-events index holds both engines' blocks")
    served_kv: Counter[str] = Counter()
    for phase, loads in enumerate(({credited: 4, other: 0}, {credited: 0, other: 4})):
        rig.phantom(**loads, **{"engine-2": 4})
        less_loaded = min(loads, key=loads.__getitem__)
        for q in range(4):
            served, decision = rig.route(prefix + f" kv phase {phase} question {q}?")
            served_kv[served] += 1
            matched = rig.matched(decision)
            assert matched[credited] > 1900 and matched[other] > 1900 and matched["engine-2"] == 0, matched
            assert served == less_loaded, decision
            assert_formula(decision)
    assert served_kv == {credited: 4, other: 4}  # the hot prefix's traffic is shared as loads diverge

    # ---- arm 2: the LMCache source credits one holder: the same loads cannot move the traffic ----
    rig.start_sidecar("lmcache")
    rig.phantom(**{credited: 0, other: 0, "engine-2": 0})
    wait_until(lambda: rig.route(prefix + " lmcache warm-up?")[0] == credited, message="the LMCache instance map")
    served_lm: Counter[str] = Counter()
    for phase, loads in enumerate(({credited: 4, other: 0}, {credited: 0, other: 4})):
        rig.phantom(**loads, **{"engine-2": 4})
        for q in range(4):
            served, decision = rig.route(prefix + f" lmcache phase {phase} question {q}?")
            served_lm[served] += 1
            matched = rig.matched(decision)
            assert matched[credited] >= 1792 and matched[other] == 0, matched  # single-holder credit
            assert_formula(decision)
    assert served_lm == {credited: 8}  # with 4 running on the credited holder, its prefix stays there
    rig.phantom(**{credited: 0, other: 0, "engine-2": 0})


def test_killed_and_restarted_engine_loses_its_credit(rig: Rig) -> None:
    prefix = hot_prefix(2)
    rig.start_sidecar("kv-events")
    rig.warm_directly("engine-2", prefix + " warm?")
    wait_until(lambda: rig.kv_engine("engine-2")["blocks"] > 100, message="engine-2's blocks indexed")
    _, decision = rig.route(prefix + " before the kill?")
    assert rig.matched(decision)["engine-2"] > 1900

    os.killpg(rig.engine2.pid, signal.SIGKILL)  # no goodbye: the connection just drops
    rig.engine2.stop()
    wait_until(lambda: not rig.kv_engine("engine-2")["connected"] and rig.kv_engine("engine-2")["blocks"] == 0,
               message="the dead engine's index dropped")
    assert rig.sidecar is not None
    assert 'reason="vanished"' in rig.sidecar.metrics_text()

    assert rig.stack.lmcache is not None
    rig.engine2 = start_engine2(rig.log_dir, rig.stack.lmcache)  # same address, empty cache, numbering from 0
    wait_until(lambda: rig.kv_engine("engine-2")["connected"], message="the restarted engine's feed reconnected")
    # Its failed scrapes while it was down ejected it: a decision skips it until a scrape says it is back
    # (then it is probing, a candidate again).
    wait_until(lambda: rig.routing_state("engine-2") != "ejected", timeout=60,
               message="the restarted engine back in rotation")
    _, decision = rig.route(prefix + " after the restart?")
    assert rig.matched(decision)["engine-2"] == 0, decision
    # and the fresh engine earns credit again from its own new events
    rig.warm_directly("engine-2", prefix + " warm again?")
    wait_until(lambda: rig.kv_engine("engine-2")["blocks"] > 100, message="engine-2 indexed again")
    _, decision = rig.route(prefix + " after rewarming?")
    assert rig.matched(decision)["engine-2"] > 1900


def test_approximate_source_follows_its_own_decisions_and_says_it_guesses(rig: Rig) -> None:
    """No LMCache, no KV events consulted: the sidecar credits the engine it sent the prefix to."""
    prefix = hot_prefix(3)
    rig.start_sidecar("approx")
    rig.phantom(**{"engine-0": 0, "engine-1": 0, "engine-2": 0})
    first, decision = rig.route(prefix + " first?")
    assert max(rig.matched(decision).values()) == 0
    for q in range(3):
        served, decision = rig.route(prefix + f" follow-up {q}?")
        assert served == first
        matched = rig.matched(decision)
        assert matched[first] > 1900 and sum(matched.values()) == matched[first], matched
    assert rig.sidecar is not None
    text = rig.sidecar.metrics_text()
    assert 'loadaware_prefix_source_info{exact="false",source="approx"} 1.0' in text
    assert metric_sum(text, "loadaware_approx_credited_tokens_total") > 3 * 1900
