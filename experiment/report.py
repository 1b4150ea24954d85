"""Markdown tables and matplotlib plots from per-seed results. Pure formatting apart from file writes.

`results` everywhere is {arm name: [SeedMetrics, ...]} with the same seeds, in the same order, per arm
(paired analysis needs it).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiment import reference
from experiment.metrics import SeedMetrics, arm_valid, median_of
from experiment.stats import PairedComparison, median_difference, paired_comparison

Results = Mapping[str, Sequence[SeedMetrics]]


def _f(v: float, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    return f"{v:.{digits}f}"


def _pct(v: float) -> str:
    return "–" if math.isnan(v) else f"{v * 100:+.1f}%"


def _p(p: float) -> str:
    return "< 0.0001" if p < 0.0001 else f"{p:.4f}"


def arm_table(results: Results, with_reference: bool = False) -> str:
    """The reference's table (medians over seeds) plus latency and throughput columns."""
    head = ("| arm | imbalance | TTFT p95 s | prefix hit | SLO miss | TTFT mean s | ITL p50 ms | E2E mean s "
            "| achieved / offered | valid |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for arm, rows in results.items():
        achieved = median_of(rows, "throughput_req_s")
        offered = median_of(rows, "offered_rate")
        lines.append(
            f"| {arm} | {_f(median_of(rows, 'imbalance'))} | {_f(median_of(rows, 'ttft_p95'))} "
            f"| {_f(median_of(rows, 'prefix_hit_rate'))} | {_f(median_of(rows, 'slo_miss'))} "
            f"| {_f(median_of(rows, 'ttft_mean'))} | {_f(median_of(rows, 'itl_p50') * 1000, 1)} "
            f"| {_f(median_of(rows, 'e2e_mean'), 2)} | {_f(achieved, 2)} / {_f(offered, 2)} "
            f"({_f(achieved / offered * 100 if offered else math.nan, 0)}%) | {'yes' if arm_valid(rows) else 'VOID'} |")
        if with_reference and arm in reference.TABLE:
            r = reference.TABLE[arm]
            lines.append(f"| *reference {arm}* | *{r.imbalance:.3f}* | *{r.ttft_p95:.3f}* | *{r.prefix_hit:.3f}* "
                         f"| *{r.slo_miss:.3f}* | | | | | |")
    return "\n".join(lines)


# ---- calibration -----------------------------------------------------------------------------------------
def calibration_checks(results: Results) -> list[tuple[str, float, str, bool]]:
    """(what, ours, target, met) for each calibration target of the issue."""
    kv, rr = results.get("kvaware", []), results.get("roundrobin", [])
    out: list[tuple[str, float, str, bool]] = []
    if kv:
        imb, hit = median_of(kv, "imbalance"), median_of(kv, "prefix_hit_rate")
        ttft, itl = median_of(kv, "ttft_mean"), median_of(kv, "itl_p50")
        out += [
            ("kvaware imbalance", imb, "2.36 ± 25% (1.77–2.95)", 1.77 <= imb <= 2.95),
            ("kvaware prefix hit", hit, "0.912 ± 0.02", abs(hit - 0.912) <= 0.02),
            ("kvaware TTFT mean s", ttft, "0.19 ± 30% (0.133–0.247)", 0.133 <= ttft <= 0.247),
            ("kvaware ITL p50 ms", itl * 1000, "42 ± 30% (29–55)", 0.029 <= itl <= 0.055),
            ("kvaware E2E mean s (not a target)", median_of(kv, "e2e_mean"), "reference ~4.2", True),
            ("kvaware busiest / idlest running (not a target)",
             median_of(kv, "running_busiest") / max(1e-9, median_of(kv, "running_idlest")), "reference ~41/17",
             True),
        ]
    if rr:
        hit = median_of(rr, "prefix_hit_rate")
        share = median_of(rr, "throughput_req_s") / median_of(rr, "offered_rate")
        out += [
            ("roundrobin prefix hit", hit, "0.682 ± 0.02", abs(hit - 0.682) <= 0.02),
            ("roundrobin achieved / offered", share, "well below 1 (reference 0.65)", share <= 0.8),
        ]
    return out


def calibration_table(results: Results) -> str:
    lines = ["| quantity (median of seeds) | DES | reference target | met |", "|---|---|---|---|"]
    for what, ours, target, met in calibration_checks(results):
        lines.append(f"| {what} | {_f(ours)} | {target} | {'yes' if met else 'NO'} |")
    return "\n".join(lines)


# ---- paired tests ----------------------------------------------------------------------------------------
PAIRED_METRICS = ("imbalance", "ttft_p95", "slo_miss", "ttft_mean")


def paired(results: Results, arm: str, base: str, metrics: Sequence[str] = PAIRED_METRICS) -> list[PairedComparison]:
    a, b = results[arm], results[base]
    if [m.seed for m in a] != [m.seed for m in b]:
        raise ValueError(f"{arm} and {base} are not paired on the same seeds")
    return [paired_comparison(m, arm, base, [getattr(x, m) for x in a], [getattr(x, m) for x in b])
            for m in metrics]


def paired_table(results: Results, arms: Sequence[str], base: str = "kvaware",
                 metrics: Sequence[str] = PAIRED_METRICS, alpha: float = 0.025) -> str:
    lines = ["| arm vs " + base + " | metric | arm median | base median | median paired change [95% CI] "
             "| one-sided exact Wilcoxon p | significant (α = " + f"{alpha}) |",
             "|---|---|---|---|---|---|---|"]
    for arm in arms:
        if arm not in results or base not in results:
            continue
        for c in paired(results, arm, base, metrics):
            e = c.effect
            lines.append(f"| {arm} | {c.metric} | {_f(c.arm_median)} | {_f(c.base_median)} "
                         f"| {_pct(e.median)} [{_pct(e.ci_low)}, {_pct(e.ci_high)}] | {_p(c.test.pvalue)} "
                         f"| {'yes' if c.significant(alpha) else 'no'} |")
        hit = median_difference([m.prefix_hit_rate for m in results[arm]],
                                [m.prefix_hit_rate for m in results[base]])
        lines.append(f"| {arm} | prefix hit (points) | {_f(median_of(results[arm], 'prefix_hit_rate'))} "
                     f"| {_f(median_of(results[base], 'prefix_hit_rate'))} | {hit.median * 100:+.2f} "
                     f"[{hit.ci_low * 100:+.2f}, {hit.ci_high * 100:+.2f}] pts | | |")
    return "\n".join(lines)


# ---- beta sweep ------------------------------------------------------------------------------------------
def sweep_table(sweep: Mapping[float, Results], criterion: str = "ttft_p95", higher_is_better: bool = False) -> str:
    """One row per offered rate: each arm's median `criterion`, the best arm, and kvaware's mean running."""
    rates = sorted(sweep)
    arms = list(next(iter(sweep.values())).keys()) if sweep else []
    head = "| rate req/s | kvaware busiest running | " + " | ".join(arms) + " | best |"
    lines = [head, "|" + "---|" * (len(arms) + 3)]
    for rate in rates:
        res = sweep[rate]
        vals = {a: median_of(res[a], criterion) for a in arms}
        best = (max if higher_is_better else min)(vals, key=lambda a: vals[a])
        lines.append(f"| {rate:g} | {_f(median_of(res.get('kvaware', []), 'running_busiest'), 1)} | "
                     + " | ".join(_f(vals[a]) for a in arms) + f" | {best} |")
    return "\n".join(lines)


def best_beta(sweep: Mapping[float, Results], criterion: str = "ttft_p95") -> dict[float, str]:
    out = {}
    for rate, res in sweep.items():
        la = {a: median_of(rows, criterion) for a, rows in res.items() if a.startswith("loadaware")}
        out[rate] = min(la, key=lambda a: la[a]) if la else ""
    return out


# ---- plots (matplotlib, headless) ------------------------------------------------------------------------
def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_imbalance(results: Results, path: Path, title: str) -> None:
    plt = _plt()
    arms = list(results)
    fig, ax = plt.subplots(figsize=(1.3 * len(arms) + 2, 4))
    data = [[min(m.imbalance, 20.0) for m in results[a]] for a in arms]
    ax.boxplot(data, showfliers=False)
    for i, d in enumerate(data, start=1):
        ax.scatter(np.full(len(d), i) + np.linspace(-0.15, 0.15, len(d)), d, s=10, alpha=0.6)
    ax.set_xticks(range(1, len(arms) + 1), arms, rotation=30, ha="right")
    ax.set_ylabel("imbalance (busiest / idlest mean running)")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ttft_cdf(ttfts: Mapping[str, np.ndarray], path: Path, title: str, slo_s: float = 0.150) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm, v in ttfts.items():
        v = np.sort(v)
        if len(v):
            ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=arm)
    ax.axvline(slo_s, color="grey", lw=0.8, ls=":", label=f"SLO {slo_s * 1000:g} ms")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT s (all seeds pooled)")
    ax.set_ylabel("share of requests")
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_hit_vs_beta(sweep: Mapping[float, Results], path: Path, title: str) -> None:
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for rate in sorted(sweep):
        res = sweep[rate]
        betas = sorted((float(a.removeprefix("loadaware-b")), a) for a in res if a.startswith("loadaware"))
        xs = [b for b, _ in betas]
        ax1.plot(xs, [median_of(res[a], "prefix_hit_rate") for _, a in betas], marker="o", label=f"{rate:g} req/s")
        ax2.plot(xs, [median_of(res[a], "ttft_p95") for _, a in betas], marker="o", label=f"{rate:g} req/s")
    ax1.set_xlabel("beta")
    ax1.set_ylabel("prefix hit rate (median of seeds)")
    ax2.set_xlabel("beta")
    ax2.set_ylabel("TTFT p95 s (median of seeds)")
    ax2.set_yscale("log")
    ax1.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_running(series: Mapping[str, tuple[list[float], dict[str, list[float]]]], path: Path, title: str) -> None:
    """Per-engine running requests over the measured window, one panel per arm (one seed)."""
    plt = _plt()
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 2.2 * len(series)), sharex=True, squeeze=False)
    for ax, (arm, (ts, per_engine)) in zip(axes[:, 0], series.items()):
        t0 = ts[0] if ts else 0.0
        for engine, vals in per_engine.items():
            ax.plot([t - t0 for t in ts], vals, lw=1, label=engine)
        ax.set_ylabel("running")
        ax.set_title(arm, fontsize=9)
        if len(per_engine) <= 8:
            ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("s since the first measured request")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def replace_section(doc: Path, start: str, end: str, section: str, before: str | None = None) -> None:
    """Put `section` (which opens with `start` and closes with `end`) into `doc`: in place of the text between
    those markers, else just before the first `before` in it, else at the end."""
    text = doc.read_text() if doc.exists() else ""
    if start in text and end in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: section, text, flags=re.S)
    elif before is not None and before in text:
        text = text.replace(before, section + "\n\n" + before, 1)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    doc.write_text(text)


def invoked_as(default: str) -> str:
    """How the running command was invoked, for a doc's "Command:" line: `default` (`python -m experiment.grid`),
    unless a runner named itself in sys.argv[0] (`python -m research grid`, research/__main__.py)."""
    return sys.argv[0] if sys.argv and sys.argv[0].startswith("python -m ") else default
