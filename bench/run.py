"""`make bench`: Envoy alone vs Envoy + sidecar — CPU per request, added latency, highest sustained rate.

    python -m bench.run [--duration S] [--rate R] [--quick] [--cases transport,decision,steps,picker,table,floor]
    python -m bench.run --cases fuzz [--fuzz-cases N]     (make bench BENCH_ARGS="--cases fuzz")

Prints its figures (it does not pass or fail) and writes out/bench/results.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import admission as admission_bench
from . import conversation_tokens as conversation_bench
from . import extproc_fuzz as fuzz_bench
from . import extproc_inprocess as extproc_bench
from . import fleet_size as fleet_size_bench
from . import kv_events as kv_events_bench
from . import long_prompts as long_prompts_bench
from . import scrape_parse as scrape_parse_bench
from .cases import BenchConfig, CaseResults, as_dict, run_decision, run_transport
from .picker import PROMPTS as PICKER_PROMPTS
from .picker import run_picker
from .report import TARGETS, case_table, picker_figures, picker_table, steps_table, summary, summary_table
from .soak import SoakConfig, run_soak, soak_table
from .table import run_table, table_config
from .table_arms import arms_by_name
from .table_report import row_figures, table_markdown
from .transport_floor import floor_table, run_floor

REPO = Path(__file__).resolve().parents[1]
CASES = ("transport", "decision", "steps", "kv_events", "scrape_parse", "extproc_inprocess", "picker", "table",
         "floor", "fuzz", "fleet_size", "admission", "long_prompts")
# Asked for by name only (`--cases soak`): the soak runs for half an hour by default.
EXTRA_CASES = ("soak", "conversation_tokens")  # conversation_tokens: in-process, the conversation cache per turn


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=None, help="measured seconds per arm (default 15)")
    p.add_argument("--rate", type=float, default=None,
                   help="fixed rate for cases 1, 2, 7 and 8, req/s (default 200)")
    p.add_argument("--warmup", type=float, default=None, help="warm-up seconds before each arm (default 2)")
    p.add_argument("--step-duration", type=float, default=None, help="seconds per rate step (default 8)")
    p.add_argument("--step-rates", default=None, help="comma list of req/s for the rate steps")
    p.add_argument("--quick", action="store_true", help="short durations: a CI smoke, not a measurement")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    p.add_argument("--arrivals", choices=("poisson", "fixed"), default="poisson")
    p.add_argument("--picker-prompts", default=None,
                   help=f"comma list of {', '.join(PICKER_PROMPTS)} for the picker case (default both)")
    p.add_argument("--picker-token-ms", type=float, default=None,
                   help="picker case: the engines' time between two streamed tokens, ms (default 2)")
    p.add_argument("--table-arms", default=None,
                   help="table case: all (default) or a comma list of its rows' names or letters a-i")
    p.add_argument("--fuzz-cases", type=int, default=None,
                   help=f"fuzz case: conversations to run (default {fuzz_bench.DEFAULT_CASES:,}; "
                        f"--quick {fuzz_bench.QUICK_CASES:,})")
    p.add_argument("--soak-duration", type=float, default=None, help="soak case: seconds of load (default 1800)")
    p.add_argument("--soak-rate", type=float, default=None, help="soak case: offered req/s (default 120)")
    p.add_argument("--soak-hangups", type=float, default=None,
                   help="soak case: share of clients that hang up mid-request (default 0.05)")
    p.add_argument("--soak-prefix-sources", default=None,
                   help="soak case: the sidecar's --prefix-source (default kv-events,approx)")
    p.add_argument("--soak-tracemalloc-s", type=float, default=None,
                   help="soak case: the sidecar writes a tracemalloc snapshot this often (default off)")
    p.add_argument("--out", default=str(REPO / "out" / "bench"), help="output folder (default out/bench)")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> BenchConfig:
    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    unknown = [c for c in cases if c not in CASES + EXTRA_CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; expected {CASES + EXTRA_CASES}")
    cfg = BenchConfig(out_dir=Path(args.out), cases=cases, arrivals=args.arrivals)
    if args.quick:
        cfg.duration, cfg.warmup, cfg.step_duration, cfg.step_rates = 3.0, 0.5, 2.0, (200, 600)
    if args.duration is not None:
        cfg.duration = args.duration
    if args.rate is not None:
        cfg.rate = args.rate
    if args.warmup is not None:
        cfg.warmup = args.warmup
    if args.step_duration is not None:
        cfg.step_duration = args.step_duration
    if args.step_rates:
        cfg.step_rates = tuple(float(r) for r in args.step_rates.split(","))
    if args.picker_prompts:
        cfg.picker_prompts = tuple(p.strip() for p in args.picker_prompts.split(",") if p.strip())
        unknown_prompts = [p for p in cfg.picker_prompts if p not in PICKER_PROMPTS]
        if unknown_prompts:
            raise SystemExit(f"unknown picker prompt(s) {unknown_prompts}; expected {tuple(PICKER_PROMPTS)}")
    if args.picker_token_ms is not None:
        cfg.picker_token_ms = args.picker_token_ms
    if args.table_arms:
        try:
            arms_by_name(args.table_arms)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        cfg.table_arms = args.table_arms
    return cfg


def soak_config(args: argparse.Namespace, cfg: BenchConfig) -> SoakConfig:
    soak = SoakConfig(out_dir=cfg.out_dir)
    if args.quick:
        soak.duration_s, soak.sample_s = 60.0, 10.0
    if args.soak_duration is not None:
        soak.duration_s = args.soak_duration
    if args.soak_rate is not None:
        soak.rate = args.soak_rate
    if args.soak_hangups is not None:
        soak.hangup_fraction = args.soak_hangups
    if args.soak_tracemalloc_s is not None:
        soak.tracemalloc_interval_s = args.soak_tracemalloc_s
    if args.soak_prefix_sources is not None:
        soak.prefix_sources = args.soak_prefix_sources
    return soak


def machine() -> dict[str, Any]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpus": os.cpu_count(), "usable_cpus": affinity, "platform": platform.platform(),
            "python": platform.python_version()}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = build_config(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = CaseResults()
    mach = machine()
    results.notes.append(
        f"{mach['usable_cpus']} usable CPU cores shared by the load generator, Envoy, the sidecar, the simulated "
        "fleet and the LMCache controller: at high rates they compete, so the rate steps measure this box, "
        "not the sidecar alone. CPU figures are per process (utime+stime).")
    error: str | None = None
    kv_result: dict[str, Any] | None = None
    parse_result: dict[str, Any] | None = None
    extproc_result: dict[str, Any] | None = None
    fuzz_result: dict[str, Any] | None = None
    table_rows: list[dict[str, Any]] | None = None
    floor_rows: list[dict[str, Any]] | None = None
    fleet_result: dict[str, Any] | None = None
    admission_result: dict[str, Any] | None = None
    long_result: dict[str, Any] | None = None
    conversation_result: dict[str, list[float]] | None = None
    soak_cfg = soak_config(args, cfg) if "soak" in cfg.cases else None
    soak_result = None
    try:
        if "transport" in cfg.cases:
            run_transport(cfg, results)
        if "decision" in cfg.cases or "steps" in cfg.cases:
            run_decision(cfg, results)
        if "kv_events" in cfg.cases:  # in-process: the index and the walk, no sockets
            kv_result = kv_events_bench.run(args.quick)
        if "scrape_parse" in cfg.cases:  # in-process: why the sidecar keeps a hand parser for /metrics
            parse_result = scrape_parse_bench.run(args.quick)
        if "extproc_inprocess" in cfg.cases:  # in-process: our own code per request and per response chunk
            extproc_result = extproc_bench.run(args.quick)
        if "picker" in cfg.cases:  # end to end: streamed responses through BUFFERED and full-duplex ext_proc
            run_picker(cfg, results)
        if "table" in cfg.cases:  # every router side by side: Envoy alone, the sidecar's setups, the peers
            table_rows = row_figures(run_table(cfg, results, arms_by_name(cfg.table_arms)))
        if "floor" in cfg.cases:  # the gRPC transport's own cost, and the server variants that could move it
            floor_rows = run_floor(cfg, results)
        if "fuzz" in cfg.cases:  # in-process and loopback gRPC: random conversations, the invariants checked
            fuzz_result = fuzz_bench.run(args.quick, args.fuzz_cases)
        if "fleet_size" in cfg.cases:  # in-process: 100 / 1,000 / 10,000 static endpoints, the event loop's lag
            fleet_result = fleet_size_bench.run(args.quick)
        if "admission" in cfg.cases:  # a shared fleet past its capacity: priorities, fairness, 429s
            admission_result = admission_bench.run(cfg.out_dir / "admission", args.quick)
        if "long_prompts" in cfg.cases:  # 50-500 KB prompts through both Envoys against the engines direct
            long_result = long_prompts_bench.run_case(cfg.out_dir / "long_prompts", args.quick)
        if "conversation_tokens" in cfg.cases:  # a 40-turn session to 220 KB: each turn's tokenization
            conversation_result = conversation_bench.run()
        if soak_cfg is not None:  # steady load for a long time: the sidecar's RSS curve
            soak_result = run_soak(soak_cfg)
    except Exception as exc:  # still print and save what was measured
        error = f"{type(exc).__name__}: {exc}"
        logging.exception("benchmark aborted")
    runtime = time.monotonic() - started
    summ = summary(results)
    doc = {"machine": mach, "config": as_dict(cfg), "targets": TARGETS, "runtime_s": runtime,
           "summary": summ, "error": error, **results.to_dict(), "kv_events": kv_result,
           "scrape_parse": parse_result, "extproc_inprocess": extproc_result,
           "picker": {case: picker_figures(results, case) for case, _, _ in PICKER_PROMPTS.values()},
           "table": None if table_rows is None else {
               "config": table_config(cfg, arms_by_name(cfg.table_arms)), "rows": table_rows},
           "floor": floor_rows, "fuzz": fuzz_result, "fleet_size": fleet_result, "admission": admission_result,
           "long_prompts": long_result, "conversation_tokens": conversation_result,
           "soak": None if soak_result is None else soak_result.to_dict()}
    out_json = cfg.out_dir / "results.json"
    out_json.write_text(json.dumps(doc, indent=2, default=str))

    parts = [f"## loadaware sidecar benchmark ({'quick smoke' if args.quick else 'full'} run, "
             f"{runtime:.0f} s, {mach['usable_cpus']} cores)\n"]
    parts += [f"- {n}" for n in results.notes]
    parts.append("")
    parts.append(case_table(results, "transport", "1a/b. Transport: tiny /v1/completions, max_tokens 1 "
                            "(sidecar policy leastload)", TARGETS["transport_sidecar_cpu_us"]))
    parts.append(case_table(results, "models_get", "1c. GET /v1/models (pass-through, body skipped)", None))
    parts.append(case_table(results, "decision", "2. Full decision: 1,578-token prompt, 64 shared prefixes "
                            "(the default policy + LMCache)", TARGETS["decision_sidecar_cpu_us"]))
    parts.append(steps_table(results.steps))
    if kv_result is not None:
        parts.append(kv_events_bench.table(kv_result))
    if parse_result is not None:
        parts.append(scrape_parse_bench.table(parse_result))
    if extproc_result is not None:
        parts.append(extproc_bench.table(extproc_result))
    streamed = f"streamed {cfg.picker_tokens}-token responses, a token every {cfg.picker_token_ms:g} ms"
    parts.append(picker_table(results, "picker", f"7a. Picker mode ({streamed}): tiny prompt (sidecar policy "
                              "leastload)"))
    parts.append(picker_table(results, "picker_decision", f"7b. Picker mode ({streamed}): 1,578-token prompt, 64 "
                              "shared prefixes (the default policy + LMCache)"))
    if table_rows is not None:
        parts.append(table_markdown(table_rows, cfg.rate, cfg.duration))
    if floor_rows is not None:
        parts.append(floor_table(floor_rows))
    if fuzz_result is not None:
        parts.append(fuzz_bench.table(fuzz_result))
    if fleet_result is not None:
        parts.append(fleet_size_bench.table(fleet_result))
    if admission_result is not None:
        parts.append(admission_bench.table(admission_result))
    if long_result is not None:
        parts.append(long_prompts_bench.table(long_result))
    if conversation_result is not None:
        parts.append(conversation_bench.table(conversation_result))
    if soak_cfg is not None and soak_result is not None:
        parts.append(soak_table(soak_cfg, soak_result))
    parts.append(summary_table(summ, cfg.rate))
    if error:
        parts.append(f"**Run aborted early:** {error}\n")
    parts.append(f"JSON: {out_json}; logs: {cfg.log_dir}")
    print("\n".join(p for p in parts if p is not None))
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main())
