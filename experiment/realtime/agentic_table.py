"""The real-time agentic runs' table (driver --point agentic) into docs/results.md.

    python -m experiment.realtime.agentic_table OUT [--doc docs/results.md]

Per arm, over the seeds found in OUT/runs/*/seed-*/run.json: the median of the seeds' TTFT p50 and p95 (turns that
answered; a turn re-sent after a 404 counts from its first send) and the Responses follow-ups that answered 200
at once (pooled over seeds), with every status they got.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiment.report import replace_section

START, END = "<!-- agentic-rt:start -->", "<!-- agentic-rt:end -->"


def load(out: Path) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(out.glob("runs/*/seed-*/run.json")):
        info = json.loads(path.read_text())
        if "agentic" in info:
            runs.setdefault(info["arm"], []).append(info)
    return runs


def table(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = ["| arm | seeds | TTFT p50 s | TTFT p95 s | follow-ups answering 200 | their statuses | turns answered |",
             "|---|---|---|---|---|---|---|"]
    for arm, infos in runs.items():
        a = [i["agentic"] for i in infos]
        ok, total = sum(x["follow_ups_200"] for x in a), sum(x["follow_ups"] for x in a)
        statuses: dict[str, int] = {}
        for x in a:
            for k, v in x["follow_up_statuses"].items():
                statuses[k] = statuses.get(k, 0) + v
        seeds = ",".join(str(i["seed"]) for i in sorted(infos, key=lambda i: i["seed"]))
        lines.append(f"| {arm} | {seeds} | {statistics.median(x['ttft_p50'] for x in a):.3f} | "
                     f"{statistics.median(x['ttft_p95'] for x in a):.3f} | {ok / max(1, total):.1%} ({ok}/{total}) | "
                     f"{', '.join(f'{k}: {v}' for k, v in sorted(statuses.items()))} | "
                     f"{sum(x['turns_ok'] for x in a)}/{sum(x['turns'] for x in a)} |")
    return lines


def section(runs: dict[str, list[dict[str, Any]]], command: str, note: str = "") -> str:
    lines = [START, "## Agentic sessions (real time)", "",
             f"`{command}`: the `agentic` point (experiment/realtime/points.py: 16 root sessions at 0.4/s, 3-8 "
             "turns, replies of 16-64 tokens, sub-agents, 40% of root sessions on the Responses API) through "
             "Envoy (BUFFERED) + the sidecar (`default`: `--policy auto`, LMCache and its record; `loadaware-b1.0`: "
             "stock LMCache alone) or a peer router, on 4 simulated engines (calibrated, response store on). "
             "Medians over seeds of each seed's TTFT p50/p95; follow-ups pooled.", "", *table(runs)]
    if note:
        lines += ["", note]
    lines.append(END)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiment.realtime.agentic_table")
    p.add_argument("out", type=Path)
    p.add_argument("--doc", type=Path, default=None)
    p.add_argument("--command", default="python -m experiment.realtime.driver --point agentic")
    p.add_argument("--note", default="")
    args = p.parse_args(argv)
    text = section(load(args.out), args.command, args.note)
    print(text)
    if args.doc is not None:
        replace_section(args.doc, START, END, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
