"""What crediting prompts queued at engines (loadaware/prefix/queued.py) costs `lane-spread`'s hot path, paired.

    python -m research.probes.queued_cost [--quick] [--json]

One sidecar (`--policy lane-spread`, the tiny tokenizer, the KV-events prefix source with no engine indexed yet, so
every prompt is cold and the queued credit is all the credit there is, three endpoints), fed
Envoy's BUFFERED message sequence for a 1,300-token prompt as `bench.extproc_inprocess` feeds it. Rounds
alternate between the sidecar as built and the same sidecar with its queued-prefix index detached (no credit,
no hold, no release); each figure is the median over rounds of (with - without), CPU µs per request. Two
fleets: one whose engines have free slots (a fresh scrape says waiting 0: the index does nothing), one whose
every engine queues (waiting 8), with 32 earlier requests for the same prompt held on each, so every decision
walks the prompt, is credited, holds and releases.

Its own code is also timed directly (timeit, best of 7): the prompt's key chain, the credit over three queueing
candidates, and one hold with its release. Here the index computes the chain itself (no engine is indexed, so
the KV-events lookup walks nothing): the worst case. A KV-events lookup that walks an indexed engine has
computed it already for the same decision (blocks.LAST_KEYS), and so has the approximate source.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from bench import inprocess_cli
from bench.extproc_inprocess import FLEET, TINY_MODEL_DIR, buffered_messages
from loadaware.app import Sidecar
from loadaware.config import from_args
from loadaware.lifecycle import Decision
from loadaware.load.tracker import EngineStats
from loadaware.prefix.blocks import block_keys
from loadaware.prefix.queued import QueuedPrefixes, credit
from loadaware.routing.request import parse_body
from research.probes.signals_cost import _best_us, _paired

HELD_PER_ENDPOINT = 32
QUEUE = 8.0


class Detach:
    """Attaches and detaches one sidecar's queued-prefix index, and keeps its scrape fresh (`waiting`)."""

    def __init__(self, app: Sidecar, waiting: float) -> None:
        self.app = app
        queued = app.decider.queued
        assert queued is not None
        self.queued: QueuedPrefixes = queued
        self.waiting = waiting

    def set(self, on: bool) -> None:
        now = self.app.loads.clock()
        for ep in self.app.registry.snapshot():
            self.app.loads.record(ep, EngineStats(64.0, self.waiting, None, now))
        q = self.queued
        if on:
            self.app.decider.queued = q
            q.__dict__.pop("on_decided", None)
            q.__dict__.pop("on_ended", None)
        else:
            self.app.decider.queued = None
            q.on_decided = q.on_ended = _nothing  # type: ignore[method-assign]


def _nothing(decision: Decision) -> None:
    return None


def _app() -> Sidecar:
    return Sidecar(from_args(["--endpoints", FLEET, "--metrics-listen", "off", "--policy", "lane-spread",
                              "--tokenizer", str(TINY_MODEL_DIR), "--prefix-source", "kv-events"], environ={}))


async def _direct(app: Sidecar, body: bytes) -> dict[str, float]:
    decision = await app.decider.decide(parse_body("completions", body), "direct", count=False)
    tokens = decision.tokens or []
    queued = app.decider.queued
    assert queued is not None and tokens
    chain = block_keys(tokens)
    keys = queued.keys(tokens)
    index = queued.index
    endpoint = app.registry.snapshot()[0]

    def hold_release() -> None:
        receipt = index.hold(endpoint, keys)
        assert receipt is not None
        index.release(receipt)

    return {"prompt_tokens": float(len(tokens)), "blocks": float(len(chain)), "held_keys": float(len(keys)),
            "key_chain": _best_us(lambda: block_keys(tokens), number=500),
            "credit": _best_us(lambda: credit(decision.candidates, index, keys, len(tokens))),
            "hold_release": _best_us(hold_release)}


async def _run(quick: bool) -> dict[str, Any]:
    rounds, per_round = (6, 40) if quick else (30, 100)
    body = json.dumps({"model": "m", "prompt": "the engine cache prefix token " * 260, "max_tokens": 64}).encode()
    out: dict[str, Any] = {"rounds": rounds, "requests_per_round": per_round}
    app = _app()
    try:
        messages = buffered_messages(body)
        free = await _paired(app, Detach(app, 0.0), messages, rounds, per_round)  # type: ignore[arg-type]
        queueing = Detach(app, QUEUE)
        queueing.set(True)
        probe = await app.decider.decide(parse_body("completions", body), "probe", count=False)
        keys = queueing.queued.keys(probe.tokens or [])
        for ep in app.registry.snapshot():  # earlier requests still queued there, held for the whole run
            for _ in range(HELD_PER_ENDPOINT):
                queueing.queued.index.hold(ep, keys)
        busy = await _paired(app, queueing, messages, rounds, per_round)  # type: ignore[arg-type]
        out["free_us"] = {"with": free[0], "without": free[1], "added": free[2]}
        out["queueing_us"] = {"with": busy[0], "without": busy[1], "added": busy[2]}
        out["direct_us"] = await _direct(app, body)
        out["queued"] = queueing.queued.state()
    finally:
        if app.tokenizer is not None:
            app.tokenizer.close()
    return out


def run(quick: bool = False) -> dict[str, Any]:
    return asyncio.run(_run(quick))


def table(result: dict[str, Any]) -> str:
    f, q, x = result["free_us"], result["queueing_us"], result["direct_us"]
    return "\n".join([
        f"lane-spread's queued-prefix credit, paired in-process ({result['rounds']} rounds of "
        f"{result['requests_per_round']} BUFFERED requests, medians; CPU µs per request)", "",
        "| fleet | with / without / added |", "|---|---|",
        f"| engines with free slots | {f['with']:,.1f} / {f['without']:,.1f} / {f['added']:+,.2f} |",
        f"| every engine queueing, {HELD_PER_ENDPOINT} held each | {q['with']:,.1f} / {q['without']:,.1f} / "
        f"{q['added']:+,.2f} |", "",
        f"Its own code on a {x['prompt_tokens']:,.0f}-token prompt ({x['blocks']:.0f} blocks, {x['held_keys']:.0f} "
        f"held keys; µs, best of 7): the key chain {x['key_chain']:.2f} (computed once for a KV-events lookup "
        "that walks an indexed engine), the credit over the candidates "
        f"{x['credit']:.2f}, one hold and release {x['hold_release']:.2f}.", ""])


def main(argv: Sequence[str] | None = None) -> int:
    return inprocess_cli.main("python -m research.probes.queued_cost", __doc__, run, table, argv)


if __name__ == "__main__":
    sys.exit(main())
