"""What parsing one engine's /metrics page costs the sidecar: its hand parser vs prometheus_client's.

    python -m bench.scrape_parse [--quick]

The sidecar scrapes every engine each `--scrape-interval-s` (1 s) on its event loop, so the parse is paid
engines x once a second, between decisions. Input: a page shaped like a real vLLM v1 server's
(sim/vllm_exposition.py, ~300 lines for one engine). Times are process CPU, single-threaded.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench import inprocess_cli
from loadaware.load.vllm_metrics import WANTED, combine, parse_vllm_gauges
from sim.vllm_exposition import vllm_exposition


def library_gauges(text: str) -> dict[str, float]:
    """The same figures read with prometheus_client's parser, combined as the sidecar combines them: the
    reference reading the hand parser is checked against."""
    return combine((WANTED[s.name], s.value) for family in text_string_to_metric_families(text)
                   for s in family.samples if s.name in WANTED)


def _cpu_us(parse: Callable[[str], dict[str, float]], text: str, repeat: int) -> float:
    parse(text)
    started = time.process_time()
    for _ in range(repeat):
        parse(text)
    return (time.process_time() - started) / repeat * 1e6


def run(quick: bool = False) -> dict[str, Any]:
    text = vllm_exposition(engines=1)
    repeat = 20 if quick else 300
    hand, library = _cpu_us(parse_vllm_gauges, text, repeat), _cpu_us(library_gauges, text, repeat // 4 or 1)
    return {"lines": len(text.splitlines()), "bytes": len(text), "hand_us": hand, "prometheus_client_us": library,
            "ratio": library / hand if hand else float("inf"),
            "fleet_100_engines_cpu_share": {"hand": hand * 100 / 1e6, "prometheus_client": library * 100 / 1e6}}


def table(result: dict[str, Any]) -> str:
    r = result
    share = r["fleet_100_engines_cpu_share"]
    return "\n".join([
        f"### 5. Scrape parsing: one vLLM /metrics page ({r['lines']} lines, {r['bytes'] / 1024:.0f} KiB)\n",
        "| parser | CPU per page | one core's share for 100 engines at 1 scrape/s |", "|---|---|---|",
        f"| sidecar hand parser | {r['hand_us']:,.0f} µs | {share['hand']:.1%} |",
        f"| prometheus_client | {r['prometheus_client_us']:,.0f} µs ({r['ratio']:.0f}x) | "
        f"{share['prometheus_client']:.1%} |", ""])


def main(argv: Sequence[str] | None = None) -> int:
    return inprocess_cli.main("python -m bench.scrape_parse", __doc__, run, table, argv)


if __name__ == "__main__":
    sys.exit(main())
