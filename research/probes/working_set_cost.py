"""What the prefix working set (loadaware/prefix/working_set.py) costs `lane-spread`'s hot path, paired.

    python -m research.probes.working_set_cost [--quick] [--json]

One sidecar (`--policy lane-spread`, the tiny tokenizer, the approximate prefix source, three endpoints that
stated their KV capacity), fed Envoy's message sequences as `bench.extproc_inprocess` (case 6 of `make bench`)
feeds them: BUFFERED requests, and full-duplex requests with a 64-chunk streamed response, of a 1,300-token
prompt. Rounds alternate between the sidecar as built and the same sidecar with its working set detached (the
decision then fills no working-set fields: `lane` with lane-spread's class); each figure is the median over
rounds of (with - without), so the machine's drift cancels pair by pair. Times are process CPU per request.

The working set's own code is also timed directly (timeit, best of 7) on the same prompt: its sampled keys,
filling the decision's candidates, and counting the routed request.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from bench import inprocess_cli
from bench.extproc_inprocess import FLEET, TINY_MODEL_DIR, buffered_messages, duplex_messages
from loadaware.app import Sidecar
from loadaware.config import from_args
from loadaware.load.tracker import EngineStats
from loadaware.prefix.working_set import BLOCK_TOKENS, WorkingSet, fill_candidates, sampled_keys
from loadaware.routing.request import parse_body
from research.probes.signals_cost import _best_us, _paired

CAPACITY_TOKENS = 90_000.0  # per endpoint: the DES's calibrated engine


class Detach:
    """Attaches and detaches one sidecar's working set (it keeps its state meanwhile)."""

    def __init__(self, app: Sidecar) -> None:
        self.app = app
        self.working_set = app.decider.working_set

    def set(self, on: bool) -> None:
        self.app.decider.working_set = self.working_set if on else None


def _app() -> Sidecar:
    app = Sidecar(from_args(["--endpoints", FLEET, "--metrics-listen", "off", "--policy", "lane-spread",
                             "--tokenizer", str(TINY_MODEL_DIR), "--prefix-source", "approx"], environ={}))
    for ep in app.registry.snapshot():
        app.loads.record(ep, EngineStats(0.0, 0.0, None, 0.0, kv_capacity_tokens=CAPACITY_TOKENS))
    return app


async def _direct(app: Sidecar, body: bytes) -> dict[str, float]:
    decision = await app.decider.decide(parse_body("completions", body), "direct", count=False)
    tokens = decision.tokens or []
    ws = app.decider.working_set
    assert ws is not None and tokens
    keys = sampled_keys(tokens)
    scratch = WorkingSet()
    scratch.set_capacity(ws.capacity_blocks)
    return {"prompt_tokens": float(len(tokens)), "sampled_blocks": float(len(keys)),
            "sampled_keys": _best_us(lambda: sampled_keys(tokens)),
            "fill_candidates": _best_us(lambda: fill_candidates(decision.candidates, ws, keys)),
            "observe": _best_us(lambda: scratch.observe(keys, len(tokens) // BLOCK_TOKENS))}


async def _run(quick: bool) -> dict[str, Any]:
    rounds, per_round = (6, 40) if quick else (30, 100)
    body = json.dumps({"model": "m", "prompt": "the engine cache prefix token " * 260, "max_tokens": 64}).encode()
    app = _app()
    toggle = Detach(app)
    try:
        buffered = await _paired(app, toggle, buffered_messages(body), rounds, per_round)  # type: ignore[arg-type]
        duplex = await _paired(app, toggle, duplex_messages(body), rounds, per_round // 2)  # type: ignore[arg-type]
        out: dict[str, Any] = {"rounds": rounds, "requests_per_round": per_round,
                               "buffered_us": {"with": buffered[0], "without": buffered[1], "added": buffered[2]},
                               "full_duplex_us": {"with": duplex[0], "without": duplex[1], "added": duplex[2]},
                               "direct_us": await _direct(app, body)}
        ws = app.decider.working_set
        assert ws is not None
        out["working_set"] = ws.state()
    finally:
        if app.tokenizer is not None:
            app.tokenizer.close()
    return out


def run(quick: bool = False) -> dict[str, Any]:
    return asyncio.run(_run(quick))


def table(result: dict[str, Any]) -> str:
    b, d, x = result["buffered_us"], result["full_duplex_us"], result["direct_us"]
    return "\n".join([
        f"lane-spread's working set, paired in-process ({result['rounds']} rounds of {result['requests_per_round']} "
        "requests, medians; CPU µs per request)", "",
        "| path | with / without / added |", "|---|---|",
        f"| BUFFERED | {b['with']:,.1f} / {b['without']:,.1f} / {b['added']:+,.2f} |",
        f"| full duplex (64 chunks) | {d['with']:,.1f} / {d['without']:,.1f} / {d['added']:+,.2f} |", "",
        f"Its own code on a {x['prompt_tokens']:,.0f}-token prompt ({x['sampled_blocks']:.0f} sampled blocks; µs, "
        f"best of 7): sampled keys {x['sampled_keys']:.2f}, filling the candidates {x['fill_candidates']:.2f}, "
        f"counting the routed request {x['observe']:.2f}; in all "
        f"{x['sampled_keys'] + x['fill_candidates'] + x['observe']:.2f}.", ""])


def main(argv: Sequence[str] | None = None) -> int:
    return inprocess_cli.main("python -m research.probes.working_set_cost", __doc__, run, table, argv)


if __name__ == "__main__":
    sys.exit(main())
