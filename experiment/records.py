"""What one run of one arm on one seed collects, identically in the real-time driver and the DES.

Times are seconds on one clock per run (the driver's monotonic clock, or simulated time); only differences
are ever used. Per-request records come from the client side (send, first streamed token, each later token,
end); per-engine samples are scrapes of the engines' Prometheus gauges and counters, as the reference took
them.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path


@dataclass(slots=True)
class RequestRecord:
    index: int
    send_t: float
    engine: str | None = None  # who served it (x-served-by, or the DES's choice); None if unknown
    first_token_t: float | None = None  # None: no token ever arrived
    end_t: float | None = None  # last byte (success) or the failure time
    itl: list[float] = field(default_factory=list)  # gaps between consecutive streamed tokens
    ok: bool = False
    error: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    prefix: int = -1  # popularity rank of the request's prefix (workload bookkeeping)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_t is None else self.first_token_t - self.send_t

    @property
    def e2e(self) -> float | None:
        return None if self.end_t is None else self.end_t - self.send_t


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One scrape of one engine (vLLM v1 metric names in the comments)."""

    t: float
    engine: str
    running: float  # vllm:num_requests_running
    waiting: float  # vllm:num_requests_waiting
    kv_usage: float  # vllm:kv_cache_usage_perc, 0..1
    prefix_queries: float  # vllm:prefix_cache_queries_total (tokens, counter)
    prefix_hits: float  # vllm:prefix_cache_hits_total (tokens, counter)


@dataclass
class RunRecords:
    """Everything one (arm, seed) run produced, plus the measurement window it defines."""

    arm: str
    seed: int
    requests: list[RequestRecord]
    samples: list[EngineSample]
    window: tuple[float, float]  # [first measured send, last measured end]: scrapes inside it count
    offered_rate: float = 0.0


def write_samples_csv(path: Path, samples: Iterable[EngineSample]) -> None:
    names = [f.name for f in fields(EngineSample)]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(names)
        for s in samples:
            w.writerow([getattr(s, n) for n in names])


def write_requests_csv(path: Path, records: Sequence[RequestRecord]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["index", "send_t", "engine", "ttft", "e2e", "ok", "error", "prompt_tokens",
                    "output_tokens", "prefix", "itl_mean"])
        for r in records:
            w.writerow([r.index, f"{r.send_t:.6f}", r.engine, _fmt(r.ttft), _fmt(r.e2e), int(r.ok),
                        r.error or "", r.prompt_tokens, r.output_tokens, r.prefix,
                        _fmt(sum(r.itl) / len(r.itl) if r.itl else None)])


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.6f}"
