"""`make profile`: where the sidecar's CPU goes, sampled by py-spy under the table's load.

    python -m bench.profile [--arm buffered_approx_tok] [--rate 200] [--duration 20] [--no-native]

Runs one sidecar row of the table (default (c): Envoy + sidecar BUFFERED, approximate prefix source, the
tokenizer) at the fixed open-loop rate on the FAST_FLEET engines and, while the load runs, records the
sidecar process with py-spy twice, one window after the other: a flame graph (out/bench/profile.svg) and the
raw collapsed stacks (out/bench/profile.raw.txt), which bench/pyspy.py ranks into out/bench/profile-summary.txt
(top functions by own and total time, by thread, by file). Two windows because py-spy writes one format per
recording, and two samplers attached at once would fight over ptrace.

py-spy pauses the process for each sample (100 Hz by default): the CPU per request printed here is inflated
by that and is not a benchmark figure; the table's rows are.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from testkit.envoy import EnvoyProc
from testkit.paths import venv_tool

from .cases import BenchConfig, decision_bodies_files, load_spec
from .loadgen import LoadResult
from .measure import run_loadgen
from .pyspy import parse_raw, summary
from .table import Sidecars, started, table_fleet
from .table_arms import TableArm, arms_by_name

REPO = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    p.add_argument("--arm", default="buffered_approx_tok", help="a sidecar row of the table (name or letter b-g)")
    p.add_argument("--rate", type=float, default=200.0, help="open-loop rate, req/s (default 200)")
    p.add_argument("--duration", type=int, default=20, help="seconds per py-spy window (two windows; default 20)")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of load before sampling (default 3)")
    p.add_argument("--sample-rate", type=int, default=100, help="py-spy samples per second (default 100)")
    p.add_argument("--no-native", action="store_true",
                   help="Python frames only (default: native frames too: the tokenizer's Rust, gRPC's C core)")
    p.add_argument("--top", type=int, default=25, help="functions listed per ranking (default 25)")
    p.add_argument("--out", default=str(REPO / "out" / "bench"), help="output folder (default out/bench)")
    return p.parse_args(argv)


def pyspy_cmd(pid: int, out: Path, fmt: str, seconds: int, rate: int, native: bool) -> list[str]:
    cmd = [venv_tool("py-spy"), "record", "--pid", str(pid), "--output", str(out), "--format", fmt,
           "--duration", str(seconds), "--rate", str(rate), "--threads"]
    if fmt == "raw":
        cmd.append("--function")  # one entry per function, not per line: the ranking is by function
    if native:
        cmd.append("--native")
    return cmd


def record(pid: int, out: Path, fmt: str, args: argparse.Namespace, native: bool) -> tuple[list[str], str]:
    """One py-spy window; returns (the command that worked, notes). Native unwinding can fail where Python
    frames do not (a stripped library): then the window is retried without it, and the note says so."""
    cmd = pyspy_cmd(pid, out, fmt, args.duration, args.sample_rate, native)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 60)
    if proc.returncode == 0 and out.exists():
        return cmd, ""
    err = (proc.stderr or proc.stdout).strip().splitlines()
    first = err[0] if err else f"rc={proc.returncode}"
    if native:
        log.warning("py-spy --native failed (%s); retrying with Python frames only", first)
        cmd2, note = record(pid, out, fmt, args, native=False)
        return cmd2, f"--native failed ({first}); recorded without it. {note}".strip()
    raise RuntimeError(f"py-spy failed: {' '.join(cmd)}\n{(proc.stderr or proc.stdout)[-2000:]}")


def _sidecar_arm(name: str) -> TableArm:
    arms = arms_by_name(name)
    if len(arms) != 1 or arms[0].sidecar is None:
        raise SystemExit(f"--arm {name!r}: expected one sidecar row of the table (b-g)")
    return arms[0]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    arm = _sidecar_arm(args.arm)
    assert arm.sidecar is not None and arm.envoy_config is not None
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = BenchConfig(out_dir=out_dir, rate=args.rate, warmup=args.warmup)
    _, bodies_file = decision_bodies_files(cfg)
    svg, raw, text = out_dir / "profile.svg", out_dir / "profile.raw.txt", out_dir / "profile-summary.txt"
    notes: list[str] = []
    with table_fleet(cfg, (arm,)) as (fleet, lmcache), contextlib.ExitStack() as stack:
        sidecars = Sidecars(cfg, fleet.endpoints, lmcache)
        stack.callback(sidecars.stop)
        sidecar = sidecars.get(arm.sidecar)
        envoy = stack.enter_context(started(EnvoyProc(arm.envoy_config, cfg.log_dir), cfg, "envoy"))
        # One load run covers the warm-up and both windows (py-spy's start-up and a margin included).
        load_s = args.warmup + 2 * args.duration + 6
        spec = load_spec(cfg, f"{envoy.url}/v1/completions", args.rate, load_s, bodies_file=bodies_file)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            load = pool.submit(run_loadgen, spec, cfg.work_dir, f"profile-{arm.name}")
            time.sleep(args.warmup)
            svg_cmd, note = record(sidecar.pid, svg, "flamegraph", args, native=not args.no_native)
            notes += [note] if note else []
            cpu0, t0 = sidecar.cpu_seconds(), time.monotonic()
            raw_cmd, note = record(sidecar.pid, raw, "raw", args, native=not args.no_native)
            notes += [note] if note else []
            cpu_s, wall_s = sidecar.cpu_seconds() - cpu0, time.monotonic() - t0
            result: LoadResult = load.result()
    prof = parse_raw(raw.read_text().splitlines())
    # The busy samples should account for the CPU /proc saw in the same window: the filter's sanity check.
    notes.append(f"check: {prof.samples} busy samples / {args.sample_rate} Hz = {prof.samples / args.sample_rate:.1f} "
                 f"CPU-s; /proc: the sidecar used {cpu_s:.1f} CPU-s in the raw window ({wall_s:.0f} s)")
    head = [f"py-spy profile of the sidecar: table row {arm.key} ({arm.label}, {arm.mode}), {args.rate:g} req/s "
            f"open loop, 1,578-token /v1/completions bodies, {args.duration} s per window at {args.sample_rate} Hz",
            f"flame graph: {' '.join(svg_cmd)}", f"raw stacks:  {' '.join(raw_cmd)}",
            f"load: {result.sent} sent, {result.ok} ok, {result.errors} errors, {result.achieved_rate:.0f} req/s "
            f"achieved; sidecar CPU during the raw window {cpu_s / max(wall_s, 1e-9):.2f} cores, "
            f"~{cpu_s / max(1.0, args.rate * wall_s) * 1e6:,.0f} µs/req (inflated by py-spy's pauses)",
            *notes]
    text.write_text(summary(prof, args.top, "\n".join(head)))
    print(text.read_text())
    print(f"flame graph: {svg}\nraw stacks: {raw}\nsummary: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
