"""Read Prometheus text exposition just enough to diff histogram sums and counts between two scrapes."""

from __future__ import annotations

from collections.abc import Mapping

from testkit.metrics_text import escape_label_value, samples

Labels = tuple[tuple[str, str], ...]


def parse_samples(text: str) -> dict[tuple[str, Labels], float]:
    """{(metric name, sorted labels): value} for every sample; comments and junk are skipped. Label values
    are spelled as in the exposition (escaped), so a key reads the same as the line it came from."""
    out: dict[tuple[str, Labels], float] = {}
    for s in samples(text):
        labels = tuple(sorted((k, escape_label_value(v)) for k, v in s.labels.items()))
        out[(s.name, labels)] = float(s.value)
    return out


def histogram_sums_counts(text: str, name: str, by: str | None = None) -> dict[str, tuple[float, float]]:
    """{label value of `by` (or "" when by is None): (sum, count)} for histogram `name`."""
    parsed = parse_samples(text)
    out: dict[str, list[float]] = {}
    for (metric, labels), value in parsed.items():
        if metric not in (f"{name}_sum", f"{name}_count"):
            continue
        key = dict(labels).get(by, "") if by is not None else ""
        slot = out.setdefault(key, [0.0, 0.0])
        slot[0 if metric.endswith("_sum") else 1] += value
    return {k: (v[0], v[1]) for k, v in out.items()}


def histogram_delta_means(before: str, after: str, name: str, by: str | None = None
                          ) -> dict[str, dict[str, float]]:
    """Per label value: observations and mean seconds between two scrapes ({"count", "mean_s"})."""
    b = histogram_sums_counts(before, name, by)
    a = histogram_sums_counts(after, name, by)
    out: dict[str, dict[str, float]] = {}
    for key, (s1, c1) in a.items():
        s0, c0 = b.get(key, (0.0, 0.0))
        dc = c1 - c0
        out[key] = {"count": dc, "mean_s": (s1 - s0) / dc if dc > 0 else float("nan")}
    return out


def counter_delta(before: str, after: str, name: str, match: Mapping[str, str] | None = None) -> float:
    """Sum of Δ over samples of counter `name` (`name` or `name_total`) whose labels include `match`."""
    want = dict(match or {})

    def total(text: str) -> float:
        acc = 0.0
        for (metric, labels), value in parse_samples(text).items():
            if metric not in (name, f"{name}_total"):
                continue
            d = dict(labels)
            if all(d.get(k) == v for k, v in want.items()):
                acc += value
        return acc

    return total(after) - total(before)
