"""What the token signals (loadaware/load/signals.py) cost the hot path, in-process and paired.

    python -m research.probes.signals_cost [--quick] [--json]

One sidecar per policy, fed Envoy's message sequences as `bench.extproc_inprocess` (case 6 of `make bench`)
feeds them: BUFFERED requests, and full-duplex requests with a 64-chunk streamed response. Rounds alternate
between the sidecar as built and the same sidecar with the signal tracker unsubscribed and the decider
told of no signals (the hot path as it was before the signals existed); each figure is the median over
rounds of (with - without), so the machine's drift cancels pair by pair. Per chunk: the full-duplex
difference less the no-chunk one, over 64. Times are process CPU per request.

On a shared machine those end-to-end differences carry several µs of noise, so the signals' own code is
also timed directly (timeit, best of 7, on a real decision of the same sidecar): the tracker's listeners
for one BUFFERED request (decided + ended, with the estimate on) and one full-duplex request (decided +
first chunk + ended), and building the decision's candidates with and without the signals.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import timeit
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from bench import inprocess_cli
from bench.extproc_inprocess import RESPONSE_CHUNKS, Feed, _app, buffered_messages, duplex_messages
from loadaware.app import Sidecar
from loadaware.policies import Candidate
from loadaware.routing.context import DecisionContext
from loadaware.routing.request import parse_body

POLICIES = ("leastload", "loadaware", "lane-spread", "banded")  # the selectable policies of each kind


@dataclass(frozen=True, slots=True)
class _CandidateBeforeSignals:
    """loadaware.policies.Candidate as it was before the token signals (aad3783^1): three frozen fields."""

    endpoint: str
    matched_tokens: int
    load: float


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


def _best_us(fn: Any, number: int = 2000, repeat: int = 7) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


async def _direct(app: Sidecar, body: bytes) -> dict[str, float]:
    """The signals' own code, timed alone on one real decision of `app`."""
    decider, tracker = app.decider, app.signals
    decision = await decider.decide(parse_body("completions", body), "direct", count=False)
    endpoint = decision.endpoint
    assert endpoint is not None
    for name in decider.registry.snapshot():  # a learned mean TTFT: the BUFFERED estimate is on
        sig = tracker._of(name)
        sig.counters.scraped(0.0, 0.0)
        sig.counters.scraped(1.0, 10.0)

    def buffered() -> None:
        tracker.on_decided(decision)
        tracker.on_ended(decision)

    def duplex() -> None:
        tracker.on_decided(decision)
        tracker.on_first_chunk(decision)
        tracker.on_ended(decision)

    endpoints = decider.registry.snapshot()
    matches = {endpoint: decision.prompt_tokens // 2}
    n = decision.prompt_tokens

    ctx = DecisionContext(None, endpoints=endpoints, matches=matches, tokens=list(range(n)))

    def candidates() -> None:
        decider.data.plain(ctx, True)

    out = {"tracker_buffered_request": _best_us(buffered),
           "candidate_before_signals": _best_us(lambda: _CandidateBeforeSignals(endpoint, 1, 2.0), number=20000),
           "candidate_now": _best_us(lambda: Candidate(endpoint, 1, 2.0), number=20000)}
    saved, with_signals, without = decider.signals, [], []
    for _ in range(7):  # interleaved: the machine's drift hits both alike
        decider.signals = saved
        with_signals.append(_best_us(candidates, repeat=1))
        decider.signals = None
        without.append(_best_us(candidates, repeat=1))
    decider.signals = saved
    out["candidates_with_signals"], out["candidates_without"] = min(with_signals), min(without)
    decision.first_chunk, body_bytes = True, b"data: {}"

    def later_chunk() -> None:  # what extproc/duplex.py adds to every response chunk after the first
        if decision is not None and not decision.first_chunk and body_bytes:
            app.lifecycle.first_chunk(decision)

    out["later_chunk_check"] = _best_us(later_chunk, number=20000)
    decision.first_chunk = False
    tracker.estimating = False  # as in the picker's deployment: first chunks seen
    out["tracker_duplex_request"] = _best_us(duplex)
    tracker.estimating = True
    return out


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
            direct = await _direct(app, body)
        out[policy] = {
            "direct_us": direct,
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
    rows += ["", "The signals' own code, timed directly (µs per request, best of 7)", "",
             "| policy | tracker, BUFFERED request | tracker, full-duplex request | candidates with / without "
             "signals | a later response chunk's check |", "|---|---|---|---|---|"]
    for policy in POLICIES:
        d = result[policy]["direct_us"]
        rows.append(f"| {policy} | {d['tracker_buffered_request']:,.2f} | {d['tracker_duplex_request']:,.2f} | "
                    f"{d['candidates_with_signals']:,.2f} / {d['candidates_without']:,.2f} | "
                    f"{d['later_chunk_check']:,.3f} |")
    d = result["loadaware"]["direct_us"]
    rows += ["", f"One candidate built: {d['candidate_before_signals']:,.3f} µs as before the signals (3 frozen "
             f"fields), {d['candidate_now']:,.3f} µs now ({len(fields(Candidate))} fields, plain slots)."]
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    return inprocess_cli.main("python -m research.probes.signals_cost", __doc__, run, table, argv)


if __name__ == "__main__":
    sys.exit(main())
