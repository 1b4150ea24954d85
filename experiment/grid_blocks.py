"""How often a grid run of `block` seeds would show ours ahead: a long run (e.g. 100 seeds) cut into
consecutive blocks, each judged as `experiment.grid` judges one run (one-sided exact Wilcoxon of ours against
that block's best peer by median, p < 0.025).

    python -m experiment.grid_blocks out/experiment/grid-100/per_seed.csv --ours lane [--block 20]

A point that passes in every block is a lead a 20-seed grid shows every time; one that passes in one block
of five is a lead too small for 20 seeds, however small the p over all of them. Pure functions over per-seed
metrics; the CLI reads the per_seed.csv that `experiment.grid` writes.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from experiment.arms import PEER_ARMS
from experiment.metrics import SeedMetrics
from experiment.stats import paired_comparison

PEERS = tuple(a.name for a in PEER_ARMS)
ALPHA = 0.025
Results = Mapping[str, Mapping[str, Sequence[SeedMetrics]]]  # {point: {arm: [per seed, same seed order]}}


def median_over_seeds(values: Sequence[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def best_peer(res: Mapping[str, Sequence[SeedMetrics]], metric: str, peers: Sequence[str] = PEERS) -> str:
    """The peer with the lowest median of `metric` over the seeds given."""
    return min((p for p in peers if p in res), key=lambda p: median_over_seeds([getattr(m, metric) for m in res[p]]))


@dataclass(frozen=True, slots=True)
class BlockSummary:
    point: str
    seeds: int
    peer: str  # the best peer over all seeds
    won: int  # seeds where ours is below that peer
    passed: int  # blocks where ours beats that block's best peer at p < ALPHA
    blocks: int


def block_summary(point: str, res: Mapping[str, Sequence[SeedMetrics]], ours: str, block: int,
                  metric: str = "ttft_p95", peers: Sequence[str] = PEERS) -> BlockSummary:
    """Ours against the best peer over every seed (seeds won) and block by block (blocks passed). Seeds past
    the last whole block count in `won` only."""
    if block < 1:
        raise ValueError("block must be >= 1")
    n = len(res[ours])
    peer = best_peer(res, metric, peers)
    x = [getattr(m, metric) for m in res[ours]]
    won = sum(a < b for a, b in zip(x, (getattr(m, metric) for m in res[peer])))
    passed = 0
    for start in range(0, n - block + 1, block):
        part = {a: list(ms[start:start + block]) for a, ms in res.items()}
        p = best_peer(part, metric, peers)
        c = paired_comparison(metric, ours, p, x[start:start + block], [getattr(m, metric) for m in part[p]])
        passed += c.significant(ALPHA)
    return BlockSummary(point, n, peer, won, passed, n // block)


def block_table(results: Results, ours: str, block: int, metric: str = "ttft_p95") -> list[str]:
    """Markdown lines: per point, seeds won against the best peer and blocks passed."""
    lines = [f"| point | best peer | seeds where `{ours}` is lower | {block}-seed blocks with p < {ALPHA} |",
             "|---|---|---|---|"]
    for name, res in results.items():
        s = block_summary(name, res, ours, block, metric)
        lines.append(f"| {name} | {s.peer} | {s.won} of {s.seeds} | {s.passed} of {s.blocks} |")
    return lines


_INTS = {f.name for f in fields(SeedMetrics) if f.type in ("int", int)}


def read_per_seed(path: Path) -> dict[str, dict[str, list[SeedMetrics]]]:
    """The per_seed.csv `experiment.grid` writes, back as {point: {arm: [SeedMetrics by seed]}}; refuses arms
    that are not paired on the same seeds."""
    out: dict[str, dict[str, list[SeedMetrics]]] = {}
    names = [f.name for f in fields(SeedMetrics)]
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            values = {k: (row[k] if k == "arm" else int(row[k]) if k in _INTS else float(row[k])) for k in names}
            out.setdefault(row["point"], {}).setdefault(row["arm"], []).append(SeedMetrics(**values))  # type: ignore[arg-type]
    for point, res in out.items():
        seeds = None
        for arm, ms in res.items():
            ms.sort(key=lambda m: m.seed)
            got = [m.seed for m in ms]
            if seeds is None:
                seeds = got
            elif got != seeds:
                raise ValueError(f"{point}: {arm} is not paired on the same seeds as the other arms")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiment.grid_blocks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("per_seed", type=Path, help="per_seed.csv from experiment.grid")
    ap.add_argument("--ours", required=True)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--metric", default="ttft_p95")
    args = ap.parse_args(argv)
    if args.block < 1:
        ap.error("--block must be >= 1")
    results = read_per_seed(args.per_seed)
    if any(args.ours not in res for res in results.values()):
        ap.error(f"--ours {args.ours} is not in {args.per_seed}")
    print("\n".join(block_table(results, args.ours, args.block, args.metric)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
