"""The demo's closing act: a short real-time run of the reference experiment, and its table."""

from __future__ import annotations

from pathlib import Path


def run_short_experiment(out: Path, point_name: str) -> str:
    """The closing short version of the reference experiment (experiment/realtime/demo_run.py): a fresh
    fleet, Envoy, sidecar per arm; prints the per-arm table. Returns "ok", or "skipped" without numpy."""
    try:
        from experiment.realtime.demo_run import DEMO_ARMS, DEMO_SEEDS, demo_point, run_demo_experiment
    except ImportError as e:  # the experiment extra (numpy) is not installed in this environment
        print(f"\n(short experiment skipped: {e}; `make experiment` installs what it needs)", flush=True)
        return "skipped"
    point = demo_point(point_name)
    wl = point.workload
    print(f"\n== Experiment (short, {point.name} point): seeds {DEMO_SEEDS}, arms {DEMO_ARMS}", flush=True)
    print(f"   {point.engines} engines, {wl.rate:g} req/s, ~{wl.prefix_tokens + wl.suffix_tokens:,}-token prompts "
          f"over {wl.n_prefixes} Zipf({wl.zipf_s:g}) prefixes, {wl.warmup_passes} warm-up pass(es), "
          f"{wl.n_requests} measured requests per seed (`make experiment` runs 500 x 20 seeds, every arm and both "
          "peer routers)", flush=True)
    table = run_demo_experiment(out, point_name)
    print("\nmedians over seeds (imbalance = busiest / idlest mean running; SLO = TTFT <= 150 ms):", flush=True)
    print(table, flush=True)
    return "ok"
