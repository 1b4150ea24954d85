"""Per-seed metrics exactly as the reference defines them (experiment/README.md). Pure functions.

- imbalance   = busiest / idlest engine's mean `vllm:num_requests_running` over the seed's window
- prefix hit  = sum over engines of delta prefix_cache_hits / sum of delta prefix_cache_queries (tokens)
- SLO miss    = share of SENT requests without a first token within the TTFT objective (errors count)
- KV spread   = busiest / idlest mean `vllm:kv_cache_usage_perc`
- TTFT / E2E percentiles over successful requests; ITL percentiles over every inter-token gap of every
  successful request pooled (as vLLM's benchmark_serving does); throughput = successes (and their output
  tokens) / (last end - first send); error rate = failures / sent.
- validity gate: a seed with more than 10% errors voids its arm.

Percentiles use numpy's default linear interpolation, as the reference's vLLM benchmark tooling does.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from experiment.records import EngineSample, RequestRecord, RunRecords

DEFAULT_SLO_S = 0.150
MAX_ERROR_RATE = 0.10


def _in_window(samples: Iterable[EngineSample], window: tuple[float, float]) -> list[EngineSample]:
    lo, hi = window
    return [s for s in samples if lo - 1e-9 <= s.t <= hi + 1e-9]


def mean_by_engine(samples: Iterable[EngineSample], window: tuple[float, float],
                   value: Callable[[EngineSample], float]) -> dict[str, float]:
    """Each engine's mean of `value` over the scrapes inside the window."""
    acc: dict[str, list[float]] = defaultdict(list)
    for s in _in_window(samples, window):
        acc[s.engine].append(value(s))
    return {e: sum(v) / len(v) for e, v in sorted(acc.items())}


def busiest_over_idlest(means: dict[str, float]) -> float:
    """max / min of per-engine means: 1.0 for an idle fleet, inf if one engine sat idle while another
    worked (the ratio is unbounded; callers that average must expect it)."""
    if not means:
        return math.nan
    hi, lo = max(means.values()), min(means.values())
    if hi <= 0:
        return 1.0
    return hi / lo if lo > 0 else math.inf


def imbalance(samples: Iterable[EngineSample], window: tuple[float, float]) -> float:
    return busiest_over_idlest(mean_by_engine(samples, window, lambda s: s.running))


def kv_spread(samples: Iterable[EngineSample], window: tuple[float, float]) -> float:
    return busiest_over_idlest(mean_by_engine(samples, window, lambda s: s.kv_usage))


def prefix_hit_rate(samples: Iterable[EngineSample], window: tuple[float, float]) -> float:
    """Counter deltas between each engine's first and last scrape in the window, summed over engines."""
    first: dict[str, EngineSample] = {}
    last: dict[str, EngineSample] = {}
    for s in sorted(_in_window(samples, window), key=lambda s: s.t):
        first.setdefault(s.engine, s)
        last[s.engine] = s
    hits = sum(last[e].prefix_hits - first[e].prefix_hits for e in first)
    queries = sum(last[e].prefix_queries - first[e].prefix_queries for e in first)
    return hits / queries if queries > 0 else math.nan


def slo_miss_share(records: Sequence[RequestRecord], slo_s: float = DEFAULT_SLO_S) -> float:
    """Share of sent requests whose first token did not arrive within `slo_s` (failures always miss)."""
    if not records:
        return math.nan
    met = sum(1 for r in records if r.ok and r.ttft is not None and r.ttft <= slo_s)
    return 1.0 - met / len(records)


def _pct(values: Sequence[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


@dataclass(frozen=True)
class SeedMetrics:
    arm: str
    seed: int
    sent: int
    ok: int
    errors: int
    error_rate: float
    ttft_mean: float
    ttft_p50: float
    ttft_p90: float
    ttft_p95: float
    ttft_p99: float
    itl_mean: float
    itl_p50: float
    itl_p95: float
    itl_p99: float
    e2e_mean: float
    e2e_p95: float
    e2e_p99: float
    throughput_req_s: float
    throughput_tok_s: float
    offered_rate: float
    imbalance: float
    prefix_hit_rate: float
    slo_miss: float
    kv_spread: float
    running_busiest: float  # mean running on the busiest engine (reference: ~41 under kvaware)
    running_idlest: float
    waiting_mean: float  # mean over engines of mean waiting (0 = the fleet never queued)
    slo_s: float

    @property
    def valid(self) -> bool:
        return self.error_rate <= MAX_ERROR_RATE

    def row(self) -> dict[str, object]:
        return asdict(self)


def seed_metrics(run: RunRecords, slo_s: float = DEFAULT_SLO_S) -> SeedMetrics:
    reqs = run.requests
    good = [r for r in reqs if r.ok and r.ttft is not None and r.e2e is not None]
    ttft = np.array([r.ttft for r in good], dtype=float)
    e2e = np.array([r.e2e for r in good], dtype=float)
    itl = np.fromiter((g for r in good for g in r.itl), dtype=float)
    sent = len(reqs)
    errors = sent - len(good)
    if reqs:
        ends = [r.end_t for r in reqs if r.end_t is not None]
        start = min(r.send_t for r in reqs)
        duration = (max(ends) if ends else start) - start
    else:
        duration = 0.0
    running = mean_by_engine(run.samples, run.window, lambda s: s.running)
    waiting = mean_by_engine(run.samples, run.window, lambda s: s.waiting)
    return SeedMetrics(
        arm=run.arm, seed=run.seed, sent=sent, ok=len(good), errors=errors,
        error_rate=errors / sent if sent else math.nan,
        ttft_mean=float(ttft.mean()) if len(ttft) else math.nan,
        ttft_p50=_pct(ttft, 50), ttft_p90=_pct(ttft, 90), ttft_p95=_pct(ttft, 95), ttft_p99=_pct(ttft, 99),
        itl_mean=float(itl.mean()) if len(itl) else math.nan,
        itl_p50=_pct(itl, 50), itl_p95=_pct(itl, 95), itl_p99=_pct(itl, 99),
        e2e_mean=float(e2e.mean()) if len(e2e) else math.nan, e2e_p95=_pct(e2e, 95), e2e_p99=_pct(e2e, 99),
        throughput_req_s=len(good) / duration if duration > 0 else math.nan,
        throughput_tok_s=sum(r.output_tokens for r in good) / duration if duration > 0 else math.nan,
        offered_rate=run.offered_rate,
        imbalance=busiest_over_idlest(running),
        prefix_hit_rate=prefix_hit_rate(run.samples, run.window),
        slo_miss=slo_miss_share(reqs, slo_s),
        kv_spread=kv_spread(run.samples, run.window),
        running_busiest=max(running.values()) if running else math.nan,
        running_idlest=min(running.values()) if running else math.nan,
        waiting_mean=sum(waiting.values()) / len(waiting) if waiting else math.nan,
        slo_s=slo_s,
    )


def arm_valid(per_seed: Iterable[SeedMetrics], max_error_rate: float = MAX_ERROR_RATE) -> bool:
    """The reference's gate: one seed above the error threshold voids the whole arm."""
    return all(m.error_rate <= max_error_rate for m in per_seed)


def median_of(per_seed: Sequence[SeedMetrics], field_name: str) -> float:
    vals = [float(getattr(m, field_name)) for m in per_seed]
    vals = [v for v in vals if not math.isnan(v)]
    return float(np.median(vals)) if vals else math.nan


# ---- the reference's published per-seed rows, in the same shape -----------------------------------------
_NAN = math.nan


def from_reference_row(cell: str, seed: int, row: dict[str, str], slo_miss: float = _NAN,
                       sent: int = 500) -> SeedMetrics:
    """A reference summary row (seed-benchmark-*-summary-per-seed.csv) as SeedMetrics, so our aggregation
    and statistics run unchanged on the reference's own numbers. Fields it lacks are NaN."""
    f = {k: float(v) for k, v in row.items() if k in SeedMetrics.__dataclass_fields__ and v not in ("", None)
         and k not in ("arm", "seed")}
    return SeedMetrics(
        arm=cell, seed=seed, sent=sent, ok=int(f.get("ok", _NAN)), errors=int(f.get("errors", _NAN)),
        error_rate=f.get("error_rate", _NAN), ttft_mean=f.get("ttft_mean", _NAN),
        ttft_p50=f.get("ttft_p50", _NAN), ttft_p90=f.get("ttft_p90", _NAN), ttft_p95=f.get("ttft_p95", _NAN),
        ttft_p99=f.get("ttft_p99", _NAN), itl_mean=_NAN, itl_p50=f.get("itl_p50", _NAN),
        itl_p95=f.get("itl_p95", _NAN), itl_p99=f.get("itl_p99", _NAN), e2e_mean=f.get("e2e_mean", _NAN),
        e2e_p95=f.get("e2e_p95", _NAN), e2e_p99=f.get("e2e_p99", _NAN),
        throughput_req_s=f.get("throughput_req_s", _NAN), throughput_tok_s=f.get("throughput_tok_s", _NAN),
        offered_rate=f.get("rate_req_s", _NAN), imbalance=f.get("imbalance", _NAN), prefix_hit_rate=_NAN,
        slo_miss=slo_miss, kv_spread=_NAN, running_busiest=_NAN, running_idlest=_NAN, waiting_mean=_NAN,
        slo_s=DEFAULT_SLO_S)
