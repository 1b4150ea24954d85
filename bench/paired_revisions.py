"""The sidecar's in-process CPU per request (bench/extproc_inprocess.py) of this checkout against another, paired:
the two run in turn, round after round, so a busy machine slows both alike; each row's figure is the median
over the rounds, and the ratio is this checkout's over the other's.

    git worktree add /tmp/base <commit>
    python -m bench.paired_revisions --base /tmp/base [--rounds 7]

The other checkout runs with this interpreter (its own `loadaware` first on the path: it runs from its folder).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from testkit.paths import REPO

ROWS = (("leastload", "buffered_us"), ("leastload", "full_duplex_us"), ("loadaware", "buffered_us"),
        ("loadaware", "full_duplex_us"), ("banded", "buffered_us"), ("loadaware", "per_response_chunk_us"))


def run(checkout: Path, quick: bool) -> dict[str, Any]:
    args = [sys.executable, "-m", "bench.extproc_inprocess", "--json", *(["--quick"] if quick else [])]
    out = subprocess.run(args, cwd=checkout, capture_output=True, text=True, check=True, timeout=900)
    record: dict[str, Any] = json.loads(out.stdout)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout (e.g. a git worktree)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="the benchmark's smoke size: a check, not a figure")
    args = parser.parse_args()
    figures: dict[str, list[dict[str, Any]]] = {"base": [], "this": []}
    for _ in range(args.rounds):
        figures["base"].append(run(args.base.resolve(), args.quick))
        figures["this"].append(run(REPO, args.quick))
    print(f"{'row':38} {'base µs':>10} {'this µs':>10} {'this/base':>10}   ({args.rounds} paired rounds)")
    for policy, field in ROWS:
        base = statistics.median(r[policy][field] for r in figures["base"])
        this = statistics.median(r[policy][field] for r in figures["this"])
        pairs = statistics.median(t[policy][field] / b[policy][field] for t, b in zip(figures["this"],
                                                                                     figures["base"]))
        print(f"{policy + ' ' + field:38} {base:10.1f} {this:10.1f} {pairs:10.3f}")


if __name__ == "__main__":
    main()
