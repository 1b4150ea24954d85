"""The reference experiment's published numbers (experiment/README.md, "The reference experiment") and its
per-seed data.

The per-seed CSVs are in experiment/reference_data/ (see its README); `EXPERIMENT_REFERENCE_DIR` overrides
the location. Prefix hit rates exist only in the published table, not in the CSVs.
"""

from __future__ import annotations

import csv
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REFERENCE_DIR = Path(os.environ.get("EXPERIMENT_REFERENCE_DIR", Path(__file__).resolve().parent / "reference_data"))
PER_SEED_CSV = "seed-benchmark-per-seed.csv"
GEN2_SUMMARY_CSV = "seed-benchmark-gen2-summary-per-seed.csv"
CONFIRMATORY = "gen2-confirmatory"  # the sweep the published table summarises


@dataclass(frozen=True)
class ReferenceRow:
    imbalance: float
    ttft_p95: float
    prefix_hit: float
    slo_miss: float


# Medians over seeds 1-20, as published. Cell names as in the CSVs.
TABLE: dict[str, ReferenceRow] = {
    "kvaware": ReferenceRow(2.358, 0.320, 0.912, 0.616),
    "loadaware-b0": ReferenceRow(2.662, 0.325, 0.9125, 0.616),
    "loadaware-b0.5": ReferenceRow(1.249, 0.295, 0.907, 0.509),
    "loadaware-b1.0": ReferenceRow(1.186, 0.268, 0.879, 0.549),
    "loadaware-b2.0": ReferenceRow(1.099, 0.336, 0.861, 0.627),
    "roundrobin": ReferenceRow(1.490, 11.0, 0.682, 0.934),
}
# Service calibration stated next to the table (kvaware arm).
KVAWARE_TTFT_MEAN_S = 0.19
KVAWARE_ITL_P50_S = 0.042
KVAWARE_E2E_MEAN_S = 4.2
ROUNDROBIN_ACHIEVED_SHARE = 0.65  # of the offered 16 req/s


def load_per_seed(sweep: str = CONFIRMATORY, path: Path | None = None) -> dict[str, dict[int, dict[str, float]]]:
    """{cell: {seed: {imbalance, ttft_p95, ttft_slo_miss_150ms, error_rate}}} of one sweep."""
    out: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)
    with (path or REFERENCE_DIR / PER_SEED_CSV).open() as fh:
        for row in csv.DictReader(fh):
            if row["sweep"] != sweep:
                continue
            out[row["cell"]][int(row["seed"])] = {k: float(v) for k, v in row.items()
                                                  if k not in ("sweep", "cell", "seed")}
    return dict(out)


def load_summary(path: Path | None = None) -> dict[str, dict[int, dict[str, str]]]:
    """{cell: {seed: the summary row (strings)}} of the confirmatory sweep's per-seed summaries."""
    out: dict[str, dict[int, dict[str, str]]] = defaultdict(dict)
    with (path or REFERENCE_DIR / GEN2_SUMMARY_CSV).open() as fh:
        for row in csv.DictReader(fh):
            out[row["cell"]][int(row["seed"])] = row
    return dict(out)


def available() -> bool:
    return (REFERENCE_DIR / PER_SEED_CSV).is_file()
