"""Prometheus text exposition, read with prometheus_client's own parser (the one parser of the tooling).

The sidecar, the simulated engines, the peer routers and Envoy all expose this format; bench, experiment,
the demo and the tests read it through here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(text: str) -> Iterator[Sample]:
    """Every sample of `text`, in order. A line the parser refuses (a truncated scrape, stray output) is
    skipped rather than failing the whole scrape: the rest of it is still good data."""
    try:
        parsed = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except ValueError:
        yield from _samples_line_by_line(text)
        return
    yield from parsed


def _samples_line_by_line(text: str) -> Iterator[Sample]:
    for line in text.splitlines():
        try:
            families = list(text_string_to_metric_families(line + "\n"))
        except ValueError:
            continue
        for family in families:
            yield from family.samples


def labels_match(sample: Sample, match: Mapping[str, str] | None) -> bool:
    return all(sample.labels.get(k) == v for k, v in (match or {}).items())


def metric_sum(text: str, name: str, match: Mapping[str, str] | None = None) -> float:
    """Sum of the samples named exactly `name` whose labels include `match` (0 when there are none)."""
    return sum(s.value for s in samples(text) if s.name == name and labels_match(s, match))


def sum_by_label(text: str, name: str, label: str) -> dict[str, float]:
    """{value of `label` ("" when absent): sum of the samples named exactly `name`}."""
    out: dict[str, float] = {}
    for s in samples(text):
        if s.name == name:
            key = s.labels.get(label, "")
            out[key] = out.get(key, 0.0) + s.value
    return out


def format_sample(sample: Sample) -> str:
    """One sample as an exposition line (labels sorted), for printing what was read."""
    labels = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in sorted(sample.labels.items()))
    return f"{sample.name}{{{labels}}} {sample.value!r}" if labels else f"{sample.name} {sample.value!r}"


def escape_label_value(value: str) -> str:
    """A label value as the exposition format writes it (backslash, newline and quote escaped)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
