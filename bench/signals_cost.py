"""What the token signals (loadaware/load/signals.py) cost the hot path, in-process and paired.

    python -m bench.signals_cost [--quick] [--json]

One sidecar per policy, fed Envoy's message sequences as `bench.extproc_inprocess` (case 6 of `make bench`)
feeds them: BUFFERED requests, and full-duplex requests with a 64-chunk streamed response. Rounds alternate
between the sidecar as built and the same sidecar with the signal tracker unsubscribed and the decider
told of no signals (the hot path as it was before the signals existed); each figure is the median over
rounds of (with - without), so the machine's drift cancels pair by pair. Per chunk: the full-duplex
difference less the no-chunk one, over 64. Times are process CPU per request.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench import inprocess_cli
from bench.extproc_inprocess import RESPONSE_CHUNKS, Feed, _app, buffered_messages, duplex_messages
from loadaware.app import Sidecar

POLICIES = ("leastload", "loadaware", "predictive")


class Toggle:
    """Switches one sidecar's token signals off and back on (the tracker keeps its state meanwhile)."""

    def __init__(self, app: Sidecar) -> None:
        self.app = app
        self.tracker = app.signals
        lifecycle = app.lifecycle
        self._listeners = list(lifecycle._listeners)
        self._progress = list(lifecycle._progress_listeners)

    def set(self, on: bool) -> None:
        lifecycle = self.app.lifecycle
        lifecycle._listeners[:] = self._listeners if on else [x for x in self._listeners if x is not self.tracker]
        lifecycle._progress_listeners[:] = self._progress if on else [
            x for x in self._progress if x is not self.tracker]
        self.app.decider.signals = self.tracker if on else None


async def _round_us(app: Sidecar, messages: list[Any], n: int) -> float:
    started = time.process_time()
    for _ in range(n):
        await app.extproc.process(None, Feed(messages))
    return (time.process_time() - started) / n * 1e6


async def _paired(app: Sidecar, toggle: Toggle, messages: list[Any], rounds: int, per_round: int
                  ) -> tuple[float, float, float]:
    """(median with, median without, median of the pairwise differences), µs per request."""
    with_us, without_us, diffs = [], [], []
    await _round_us(app, messages, per_round)  # warm both paths
    for i in range(rounds):
        order = (True, False) if i % 2 == 0 else (False, True)
        got = {}
        for on in order:
            toggle.set(on)
            got[on] = await _round_us(app, messages, per_round)
        with_us.append(got[True])
        without_us.append(got[False])
        diffs.append(got[True] - got[False])
    toggle.set(True)
    return statistics.median(with_us), statistics.median(without_us), statistics.median(diffs)


async def _run(quick: bool) -> dict[str, Any]:
    rounds, per_round = (6, 40) if quick else (30, 100)
    out: dict[str, Any] = {"rounds": rounds, "requests_per_round": per_round, "response_chunks": RESPONSE_CHUNKS}
    tiny = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()
    long = json.dumps({"model": "m", "prompt": "the engine cache prefix token " * 260, "max_tokens": 64}).encode()
    for policy in POLICIES:
        body = tiny if policy == "leastload" else long
        app = _app(policy)
        toggle = Toggle(app)
        try:
            buffered = await _paired(app, toggle, buffered_messages(body), rounds, per_round)
            duplex = await _paired(app, toggle, duplex_messages(body), rounds, per_round // 2)
            bare = await _paired(app, toggle, duplex_messages(body, chunks=0), rounds, per_round // 2)
        finally:
            if app.tokenizer is not None:
                app.tokenizer.close()
        out[policy] = {
            "buffered_us": {"with": buffered[0], "without": buffered[1], "added": buffered[2]},
            "full_duplex_us": {"with": duplex[0], "without": duplex[1], "added": duplex[2]},
            "per_response_chunk_added_us": (duplex[2] - bare[2]) / RESPONSE_CHUNKS,
        }
    return out


def run(quick: bool = False) -> dict[str, Any]:
    return asyncio.run(_run(quick))


def table(result: dict[str, Any]) -> str:
    rows = [f"Token signals' cost, paired in-process ({result['rounds']} rounds of {result['requests_per_round']} "
            "requests, medians; CPU µs per request)\n",
            "| policy | BUFFERED with / without / added | full duplex (64 chunks) with / without / added | "
            "added per response chunk |", "|---|---|---|---|"]
    for policy in POLICIES:
        r = result[policy]
        b, d = r["buffered_us"], r["full_duplex_us"]
        rows.append(f"| {policy} | {b['with']:,.1f} / {b['without']:,.1f} / {b['added']:+,.2f} | "
                    f"{d['with']:,.1f} / {d['without']:,.1f} / {d['added']:+,.2f} | "
                    f"{r['per_response_chunk_added_us']:+,.3f} |")
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    return inprocess_cli.main("python -m bench.signals_cost", __doc__, run, table, argv)


if __name__ == "__main__":
    sys.exit(main())
