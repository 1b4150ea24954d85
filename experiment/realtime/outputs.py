"""Where a real-time run's files go, and how they are read back (by the report and by tests).

    <out>/config.json                     the operating point, arms, seeds, versions, machine
    <out>/per_seed.csv                    one SeedMetrics row per (arm, seed), appended as runs finish
    <out>/runs/<arm>/seed-<n>/sender.json the sender's raw output (every request, every scrape)
    <out>/runs/<arm>/seed-<n>/run.json    wall and CPU times per process, router counters, checks
    <out>/runs/<arm>/seed-<n>/requests.csv, samples.csv   the same records, flat, for eyeballing
    <out>/logs/                           every process's log

A run that is interrupted keeps every finished (arm, seed): per_seed.csv is appended row by row, and
`--resume` skips pairs whose run.json exists.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from dataclasses import fields
from pathlib import Path
from typing import Any

from experiment.metrics import SeedMetrics
from experiment.realtime.sender import SenderResult, result_from_json
from experiment.records import RunRecords, write_requests_csv, write_samples_csv

PER_SEED = "per_seed.csv"
CONFIG = "config.json"
_INT_FIELDS = {"seed", "sent", "ok", "errors"}


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / "runs" / arm / f"seed-{seed}"


def write_run(out: Path, arm: str, seed: int, result: SenderResult, info: dict[str, Any]) -> Path:
    d = run_dir(out, arm, seed)
    d.mkdir(parents=True, exist_ok=True)
    write_requests_csv(d / "requests.csv", result.requests)
    write_samples_csv(d / "samples.csv", result.samples)
    (d / "run.json").write_text(json.dumps(info, indent=1, default=str))
    return d


def run_records(result: SenderResult, arm: str, seed: int, offered_rate: float) -> RunRecords:
    return RunRecords(arm, seed, result.requests, result.samples, result.window, offered_rate)


def load_run(out: Path, arm: str, seed: int, offered_rate: float = math.nan) -> RunRecords:
    result = result_from_json((run_dir(out, arm, seed) / "sender.json").read_text())
    return run_records(result, arm, seed, offered_rate)


def append_seed_metrics(out: Path, m: SeedMetrics, extra: dict[str, Any] | None = None) -> None:
    append_seed_metrics_to(out / PER_SEED, m, extra)


def append_seed_metrics_to(path: Path, m: SeedMetrics, extra: dict[str, Any] | None = None) -> None:
    row = {**m.row(), **(extra or {})}
    new = not path.exists()
    with path.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)


def _typed(name: str, value: str) -> Any:
    if name == "arm":
        return value
    if name in _INT_FIELDS:
        return int(float(value))
    return float(value) if value not in ("", "nan") else math.nan


def load_per_seed(path: Path) -> dict[str, dict[int, SeedMetrics]]:
    """{arm: {seed: SeedMetrics}} from a per_seed.csv (a later row for the same pair wins: a re-run)."""
    if path.is_dir():
        path = path / PER_SEED
    names = [f.name for f in fields(SeedMetrics)]
    out: dict[str, dict[int, SeedMetrics]] = defaultdict(dict)
    with path.open() as fh:
        for row in csv.DictReader(fh):
            m = SeedMetrics(**{n: _typed(n, row[n]) for n in names})
            out[m.arm][m.seed] = m
    return dict(out)


def load_config(out: Path) -> dict[str, Any]:
    return json.loads((out / CONFIG).read_text())
