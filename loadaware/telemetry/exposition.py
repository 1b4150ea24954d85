"""The /metrics text, with the families that have one series per endpoint written by hand.

Why by hand: prometheus_client's `generate_latest` builds a Sample, a label dict and a sorted, escaped label
string per series, validating each name again; at 10,000 endpoints, with twenty-odd such families, that was
most of a render (docs/results.md, "/metrics at 10,000 endpoints (December 6)"). A `TextCollector` writes its
own text instead, from its plain dicts, with one f-string per line; every other collector still goes through
`generate_latest`. The text is prometheus_client's, byte for byte, series in the same order: `# HELP` and
`# TYPE` (the help escaped the same way), label names sorted and escaped as it does, label values escaped
(backslash, newline, double quote), values written as its `floatToGoString` writes them, a counter's
`_created` samples in a gauge family of their own after its `_total` ones (tests/unit/test_metrics_text.py
compares both renderings sample for sample, then byte for byte).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

INF = float("inf")
GO_EXPONENT_FROM = 1e6  # floatToGoString switches to Go's exponent form from here; repr is its answer below


def value_text(value: float) -> str:
    """`floatToGoString(value)`, with repr's answer taken directly where they agree (every finite value
    below 1e6: NaN and the infinities fail the comparison)."""
    return repr(value) if -INF < value < GO_EXPONENT_FROM else floatToGoString(value)


def escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def family_header(name: str, documentation: str, kind: str) -> str:
    """`# HELP` and `# TYPE` as generate_latest writes them (`name` with its `_total` for a counter)."""
    help_text = documentation.replace("\\", r"\\").replace("\n", r"\n")
    name = escape_metric_name(name)
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


Series = Sequence[tuple[tuple[str, ...], float]]  # (label values in the family's label order, value) per series


class LabelLayout:
    """How one family writes its label sets: the names sorted (generate_latest sorts a sample's labels) and
    escaped once; the values reordered to match, and escaped when the text written without says some need it.

    A line is one f-string per series, the value formatted inline: at 10,000 series every extra pass over them
    shows in a render, so the label set, the value and the line are made in one."""

    def __init__(self, labelnames: Sequence[str]) -> None:
        order = sorted(range(len(labelnames)), key=labelnames.__getitem__)
        self.names = tuple(escape_label_name(labelnames[i]) for i in order)
        # itemgetter of one index returns the item, not a 1-tuple: single labels are never reordered anyway
        self._reorder = itemgetter(*order) if len(order) > 1 and order != sorted(order) else None

    def _ordered(self, series: Sequence[tuple[tuple[str, ...], Any]]) -> Sequence[tuple[tuple[str, ...], Any]]:
        reorder = self._reorder
        return series if reorder is None else [(reorder(k), v) for k, v in series]

    def _plain(self, text: str, lines: int) -> bool:
        """Whether `text`, written with the label values as they are, needed no escaping: the only double
        quotes are the two around each label value, the only newlines end lines, and there is no backslash
        (names and values' texts have none of these), so three C-speed counts over the text say it, cheaper
        than a scan of every label value."""
        return (text.count('"') == 2 * len(self.names) * lines and text.count("\n") == lines
                and "\\" not in text)

    def _escaped(self, series: Sequence[tuple[tuple[str, ...], Any]]) -> Sequence[tuple[tuple[str, ...], Any]]:
        return [(tuple(map(escape_label_value, k)), v) for k, v in series]

    def _pieces(self, sample: str) -> tuple[str, ...]:
        names = self.names
        return (f'{sample}{{{names[0]}="', *(f'",{n}="' for n in names[1:])) if names else (sample,)

    def lines(self, sample: str, series: Series) -> str:
        """One line per series, `sample{labels} value`, the value written as floatToGoString writes it."""
        series = self._ordered(series)
        text = self._float_lines(sample, series)
        return text if self._plain(text, len(series)) else self._float_lines(sample, self._escaped(series))

    def text_lines(self, sample: str, series: Sequence[tuple[tuple[str, ...], str]]) -> str:
        """As `lines`, for values already written (a counter's creation times)."""
        series = self._ordered(series)
        text = self._text_lines(sample, series)
        return text if self._plain(text, len(series)) else self._text_lines(sample, self._escaped(series))

    def _float_lines(self, sample: str, series: Series) -> str:
        go, n = floatToGoString, len(self.names)
        if n == 1:
            a, = self._pieces(sample)
            return "".join([f'{a}{k[0]}"}} {repr(v) if -INF < v < GO_EXPONENT_FROM else go(v)}\n' for k, v in series])
        if n == 2:
            a, b = self._pieces(sample)
            return "".join([f'{a}{k[0]}{b}{k[1]}"}} {repr(v) if -INF < v < GO_EXPONENT_FROM else go(v)}\n'
                            for k, v in series])
        if n == 3:
            a, b, c = self._pieces(sample)
            return "".join([f'{a}{k[0]}{b}{k[1]}{c}{k[2]}"}} {repr(v) if -INF < v < GO_EXPONENT_FROM else go(v)}\n'
                            for k, v in series])
        return self._any_lines(sample, [(k, value_text(v)) for k, v in series])

    def _text_lines(self, sample: str, series: Sequence[tuple[tuple[str, ...], str]]) -> str:
        n = len(self.names)
        if n == 1:
            a, = self._pieces(sample)
            return "".join([f'{a}{k[0]}"}} {t}\n' for k, t in series])
        if n == 2:
            a, b = self._pieces(sample)
            return "".join([f'{a}{k[0]}{b}{k[1]}"}} {t}\n' for k, t in series])
        if n == 3:
            a, b, c = self._pieces(sample)
            return "".join([f'{a}{k[0]}{b}{k[1]}{c}{k[2]}"}} {t}\n' for k, t in series])
        return self._any_lines(sample, series)

    def _any_lines(self, sample: str, series: Sequence[tuple[tuple[str, ...], str]]) -> str:
        if not self.names:
            return "".join([f"{sample} {t}\n" for _, t in series])
        return "".join(sample + "{" + ",".join([f'{n}="{v}"' for n, v in zip(self.names, k)]) + f"}} {t}\n"
                       for k, t in series)


class TextCollector(Collector):
    """A collector that can write its own exposition text (`collect` still works, for everything else that
    reads a registry: tests, `get_sample_value`)."""

    def exposition(self) -> str:
        raise NotImplementedError


class _Run(Collector):
    """Consecutive ordinary collectors, rendered by one generate_latest call."""

    def __init__(self, collectors: Sequence[Collector]) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for collector in self.collectors:
            yield from collector.collect()


def families_text(families: Iterable[Metric]) -> str:
    """generate_latest's text for these families (a TextCollector's few ordinary ones)."""
    return generate_latest(_Families(families)).decode()


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


class TextRegistry(CollectorRegistry):
    """A CollectorRegistry that remembers its collectors in the order they registered (the order
    generate_latest writes them in), so `render` can hand each TextCollector its own part of the page."""

    def __init__(self, auto_describe: bool = False) -> None:
        self._ordered: list[Collector] = []
        self._order_lock = threading.Lock()
        super().__init__(auto_describe=auto_describe)

    def set_target_info(self, labels: Any) -> None:
        if labels:
            raise ValueError("TextRegistry renders no target_info")
        super().set_target_info(labels)

    def register(self, collector: Collector) -> None:
        super().register(collector)
        with self._order_lock:
            self._ordered.append(collector)

    def unregister(self, collector: Collector) -> None:
        super().unregister(collector)
        with self._order_lock:
            self._ordered.remove(collector)

    def render(self) -> bytes:
        """What generate_latest(self) writes, byte for byte (but for a counter series made or removed while
        the page renders, whose creation time may show without its total or the other way round:
        TableCounter.exposition)."""
        with self._order_lock:
            collectors = tuple(self._ordered)
        parts: list[bytes] = []
        run: list[Collector] = []
        for collector in collectors:
            if isinstance(collector, TextCollector):
                if run:
                    parts.append(generate_latest(_Run(run)))
                    run = []
                parts.append(collector.exposition().encode())
            else:
                run.append(collector)
        if run:
            parts.append(generate_latest(_Run(run)))
        return b"".join(parts)
