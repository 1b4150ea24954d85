"""The mixed soak's bounds: what each is sized to, how its fill is read from the running sidecar, and whether
it was reached and then held.

Sizing: every bound a flag sets is made small enough to fill within `fill_s` at the soak's rate (estimated from
the traffic's mix; docs/memory.md lists the defaults, which a soak of hours would not reach), so that "every
bound reached and held" can be checked. Fill levels come from /debug/state (the admin HTTP listener), /metrics,
/debug/decisions and, for the session map (which the sidecar exposes nowhere), two probe requests.

Reached: the fill came within REACHED_SHARE of the limit. Held: after that, no sample above the limit, and the
last sample (before the load stopped) back within REACHED_SHARE of it; a dip in between (an engine left and
took its blocks along) is counted, not a failure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from testkit.metrics_text import metric_sum, samples, sum_by_label

REACHED_SHARE = 0.9
DECISIONS_RING = 256  # telemetry/decisions.py's ring: fixed, no flag
CONVERSATION_CACHE_MIB = 1  # the smallest --conversation-cache-mb (an integer); the soak's chats fill it in minutes
# --tokenizer-cache-tokens: the soak's 64 shared prefixes alone are ~99k tokens of pieces, cached from their second
# request, so half of that is full within the first minutes and then evicts all the time.
PIECE_CACHE_TOKENS = 50_000
# Engines of the soak's simulator cache 16,384 blocks each (sim/service_model.py): a KV-events bound at one
# engine's worth binds even while one of three engines is out of the fleet.
ENGINE_CACHE_BLOCKS = 16_384
# The approximate source guesses 6,250 blocks per engine (--approx-capacity-tokens 100,000 / 16): a global bound
# below that binds with any two engines in the fleet.
APPROX_PER_ENGINE_BLOCKS = 6_250
# New prompt blocks per request, averaged over the mix (a long prompt's ~500 blocks at 3% dominate).
BLOCKS_PER_REQUEST = 20.0
# Admission outcomes that mean the held-requests bound was reached (loadaware/telemetry/flow_metrics.py).
HELD_FULL_OUTCOMES = ("rejected_queue_full", "evicted", "placed_full")
# Labels whose value is an engine's address: an engine that leaves the fleet takes its series along and brings them
# back when it returns, so they are folded to one value before label sets are counted (churn is not growth).
ENDPOINT_LABELS = ("endpoint", "model_server_pod")
# Labels whose values the sidecar's code names from a fixed set (a failure's reason, a request's outcome, a
# replay's result): a value first seen late (the first scrape timeout at hour 1.5) adds a bounded set, not
# growth. The plateau is judged with these folded too; the report still lists every label set first seen late.
CLOSED_LABELS = ("reason", "result", "outcome")
MAX_SERIES_KEYS = 20_000  # a run's first-seen record; past it, an unbounded label is plain anyway


@dataclass(frozen=True)
class Bounds:
    session_max_entries: int
    state_max_entries: int
    kv_events_max_blocks: int
    approx_max_blocks: int
    admission_max_held: int
    conversation_cache_mib: int = CONVERSATION_CACHE_MIB
    tokenizer_cache_tokens: int = PIECE_CACHE_TOKENS

    def sidecar_args(self, prefix_sources: str) -> list[str]:
        args = ["--session-max-entries", str(self.session_max_entries),
                "--state-max-entries", str(self.state_max_entries),
                "--conversation-cache-mb", str(self.conversation_cache_mib),
                "--tokenizer-cache-tokens", str(self.tokenizer_cache_tokens),
                "--admission-max-held", str(self.admission_max_held)]
        if "kv-events" in prefix_sources:
            args += ["--kv-events-max-blocks", str(self.kv_events_max_blocks)]
        if "approx" in prefix_sources:
            args += ["--approx-max-blocks", str(self.approx_max_blocks)]
        return args


def size_bounds(rate: float, fill_s: float, mix: Mapping[str, float], session_share: float, chat_turns: int,
                burst_rate: float, admission_ttl_s: float) -> Bounds:
    """Bounds that fill within about `fill_s` at `rate` (a fifth of margin), never below a floor that keeps
    them meaningful."""
    total = sum(mix.values())
    share = {k: v / total for k, v in mix.items()}
    sessions_per_s = rate * (share.get("completion", 0) * session_share + share.get("chat", 0) / chat_turns)
    stored_per_s = rate * share.get("responses", 0)
    blocks = rate * BLOCKS_PER_REQUEST * fill_s * 0.8
    return Bounds(
        session_max_entries=max(50, int(sessions_per_s * fill_s * 0.8)),
        state_max_entries=max(50, int(stored_per_s * fill_s * 0.8)),
        kv_events_max_blocks=int(min(ENGINE_CACHE_BLOCKS, max(2_000, blocks))),
        approx_max_blocks=int(min(APPROX_PER_ENGINE_BLOCKS - 250, max(1_000, blocks))),
        # During a burst every request is held up to the TTL: a quarter of that pile is the bound.
        admission_max_held=max(10, int(burst_rate * admission_ttl_s * 0.25)))


@dataclass(frozen=True)
class BoundSpec:
    name: str
    limit: float
    observed: str  # where the fill is read


def bound_specs(bounds: Bounds, prefix_sources: str) -> list[BoundSpec]:
    specs = [
        BoundSpec("session_map", bounds.session_max_entries,
                  "--session-max-entries; not exposed by the sidecar: two probe requests per sample through the "
                  "gateway, one naming the session started limit/2 sessions ago (must still be bound: affinity "
                  "kept or moved in /debug/decisions), one 2 x limit ago within the TTL (must be forgotten: new)"),
        BoundSpec("state_holders", bounds.state_max_entries,
                  "--state-max-entries; /metrics loadaware_state_holders"),
        BoundSpec("conversation_cache_bytes", bounds.conversation_cache_mib * 2**20,
                  "--conversation-cache-mb; /metrics loadaware_tokenizer_conversation_cache{what=\"bytes\"}"),
        BoundSpec("piece_cache_tokens", bounds.tokenizer_cache_tokens,
                  "--tokenizer-cache-tokens; /metrics loadaware_tokenizer_piece_cache{what=\"tokens\"}"),
        BoundSpec("decisions_ring", DECISIONS_RING, "fixed 256; entries of /debug/decisions?n=100000"),
        BoundSpec("admission_held", bounds.admission_max_held,
                  "--admission-max-held; /metrics loadaware_flow_control_queue_size (summed over priorities, "
                  "read every 2 s during bursts) and loadaware_flow_control_requests_total outcomes "
                  + "/".join(HELD_FULL_OUTCOMES) + " (the bound refused or evicted a request)"),
    ]
    if "kv-events" in prefix_sources:
        specs.append(BoundSpec("kv_events_index", bounds.kv_events_max_blocks,
                               "--kv-events-max-blocks; /debug/state prefix.kv_events.total_blocks"))
    if "approx" in prefix_sources:
        specs.append(BoundSpec("approx_index", bounds.approx_max_blocks,
                               "--approx-max-blocks; /debug/state prefix.approx.total_blocks"))
    return specs


def read_fills(state: Mapping[str, Any], metrics: str, decisions: int) -> dict[str, float]:
    """Every bound's fill that one sample of /debug/state, /metrics and /debug/decisions shows."""
    prefix = state.get("prefix") or {}
    out = {"state_holders": metric_sum(metrics, "loadaware_state_holders"),
           "conversation_cache_bytes": sum_by_label(metrics, "loadaware_tokenizer_conversation_cache", "what")
           .get("bytes", 0.0),
           "conversation_cache_entries": sum_by_label(metrics, "loadaware_tokenizer_conversation_cache", "what")
           .get("entries", 0.0),
           "piece_cache_tokens": sum_by_label(metrics, "loadaware_tokenizer_piece_cache", "what").get("tokens", 0.0),
           "decisions_ring": float(decisions),
           "admission_held": metric_sum(metrics, "loadaware_flow_control_queue_size"),
           "admission_full_outcomes": held_full_outcomes(metrics),
           "metric_series": float(series_count(metrics)),
           "endpoints": float(len(state.get("endpoints") or ())),
           "inflight_total": float(state.get("inflight_total") or 0),
           # counters beside the bounds (not judged): what a step in the memory record coincided with
           "ejections_total": metric_sum(metrics, "loadaware_endpoint_ejections_total"),
           "kv_index_resets_total": metric_sum(metrics, "loadaware_kv_events_index_resets_total"),
           "kv_replays_total": metric_sum(metrics, "loadaware_kv_events_replays_total")}
    for source, name in (("kv_events", "kv_events_index"), ("approx", "approx_index")):
        if isinstance(prefix.get(source), Mapping):
            out[name] = float(prefix[source].get("total_blocks") or 0)
    return out


def held_full_outcomes(metrics: str) -> float:
    return sum(metric_sum(metrics, "loadaware_flow_control_requests_total", {"outcome": o}) for o in HELD_FULL_OUTCOMES)


def series_count(metrics: str) -> int:
    """Series in a /metrics page (its label sets: one per sample line)."""
    return sum(1 for line in metrics.splitlines() if line and not line.startswith("#"))


def folded_series(metrics: str, folded: Sequence[str] = ENDPOINT_LABELS) -> set[str]:
    """The label sets of a /metrics page (values dropped) with the values of the `folded` labels (by default every
    engine address) folded to "*": what grows only if another label takes new values."""
    keys = set()
    for sample in samples(metrics):
        labels = ",".join(f'{k}="{"*" if k in folded else v}"' for k, v in sorted(sample.labels.items()))
        keys.add(f"{sample.name}{{{labels}}}" if labels else sample.name)
    return keys


def note_first_seen(first_seen: dict[str, float], keys: Iterable[str], t_s: float) -> None:
    for key in keys:
        if key not in first_seen and len(first_seen) < MAX_SERIES_KEYS:
            first_seen[key] = t_s


def new_after(first_seen: Mapping[str, float], t_s: float) -> list[str]:
    """Label sets first seen after t_s, in order."""
    return sorted((k for k, t in first_seen.items() if t > t_s), key=lambda k: (first_seen[k], k))


@dataclass
class BoundVerdict:
    name: str
    limit: float
    observed: str
    reached: bool = False
    reached_at_s: float | None = None
    held: bool = False
    peak: float = 0.0
    last: float = 0.0
    dips: int = 0  # samples after it was reached below REACHED_SHARE of the limit
    note: str = ""
    series: list[tuple[float, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "series"}


def judge(spec: BoundSpec, series: Sequence[tuple[float, float]]) -> BoundVerdict:
    """Reached and held, from (t, fill) samples taken while the load ran."""
    v = BoundVerdict(spec.name, spec.limit, spec.observed, series=list(series))
    if not series:
        v.note = "never read"
        return v
    v.peak, v.last = max(f for _, f in series), series[-1][1]
    at = next((t for t, f in series if f >= REACHED_SHARE * spec.limit), None)
    if at is None:
        return v
    v.reached, v.reached_at_s = True, at
    after = [f for t, f in series if t >= at]
    v.dips = sum(1 for f in after if f < REACHED_SHARE * spec.limit)
    v.held = max(after) <= spec.limit and v.last >= REACHED_SHARE * spec.limit
    return v


def judge_events(spec: BoundSpec, peaks: Sequence[tuple[float, float]], full_outcomes: Sequence[tuple[float, float]]
                 ) -> BoundVerdict:
    """A bound that fills only during bursts (admission's held requests): reached when the bound refused or evicted
    a request (or the held count met it); held when no reading ever exceeded it."""
    v = BoundVerdict(spec.name, spec.limit, spec.observed, series=list(peaks))
    v.peak = max((f for _, f in peaks), default=0.0)
    v.last = full_outcomes[-1][1] if full_outcomes else 0.0
    at = next((t for t, n in full_outcomes if n > 0), None)
    at_peak = next((t for t, f in peaks if f >= spec.limit), None)
    times = [t for t in (at, at_peak) if t is not None]
    if times:
        v.reached, v.reached_at_s = True, min(times)
    v.held = v.reached and v.peak <= spec.limit
    v.note = f"{v.last:g} requests refused, evicted or placed at once by the bound"
    return v


def judge_plateau(name: str, series: Sequence[tuple[float, float]], observed: str) -> BoundVerdict:
    """A count with no configured limit (the /metrics label sets): held when the second half of the run never
    exceeds the first half's largest value."""
    v = BoundVerdict(name, float("nan"), observed, series=list(series))
    if len(series) < 2:
        v.note = "too few samples"
        return v
    half = series[-1][0] / 2
    first = [f for t, f in series if t <= half]
    second = [f for t, f in series if t > half]
    v.peak, v.last = max(f for _, f in series), series[-1][1]
    v.reached = v.reached_at_s is None and bool(first)
    v.reached_at_s = next((t for t, f in series if f >= max(first)), None) if first else None
    v.held = bool(first) and bool(second) and max(second) <= max(first)
    v.note = f"first half at most {max(first):g}, second half at most {max(second, default=0):g}"
    return v
