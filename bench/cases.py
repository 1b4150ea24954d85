"""The benchmark cases, each against a real stack: Envoy alone vs Envoy + sidecar on the same fleet."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadaware.policies.auto import AUTO
from testkit.envoy import EnvoyProc
from testkit.paths import ENVOY_PASSTHROUGH_CONFIG
from testkit.ports import free_port
from testkit.procs import ManagedProc
from testkit.retry import start_with_retries
from testkit.stack import Stack

from .loadgen import LoadSpec
from .measure import ArmResult, measure, run_loadgen
from .workload import decision_bodies, tiny_body

log = logging.getLogger("bench")

# Engines as fast as the simulator allows: we measure the router, not the engines.
FAST_FLEET = ["--prefill-tokens-per-s", "1e9", "--prefill-overhead-ms", "0", "--lmcache-load-tokens-per-s", "1e9",
              "--decode-base-ms", "0", "--decode-per-seq-ms", "0", "--max-num-seqs", "4096",
              "--serialize-prefill", "0"]
SIDECAR_COMMON = ["--log-level", "warning"]

@dataclass
class BenchConfig:
    out_dir: Path
    duration: float = 15.0
    rate: float = 200.0
    warmup: float = 2.0
    step_duration: float = 8.0
    step_rates: tuple[float, ...] = (200, 300, 400, 550, 700, 1000, 1400, 2000)
    step_max_failures: int = 2  # steps stop after this many failed steps (bounded run time)
    step_p99_limit_ms: float = 50.0
    step_min_achieved: float = 0.95
    arrivals: str = "poisson"
    connections: int = 256
    cases: tuple[str, ...] = ("transport", "decision", "steps")
    start_retries: int = 3
    # Case 7 (picker): streamed responses of this many tokens, one every picker_token_ms on the engines.
    picker_tokens: int = 64
    picker_token_ms: float = 2.0
    picker_prompts: tuple[str, ...] = ("tiny", "decision")
    # Case 8 (table): `all` or a comma list of its rows' names or letters (bench/table_arms.py).
    table_arms: str = "all"

    @property
    def log_dir(self) -> Path:
        return self.out_dir / "logs"

    @property
    def work_dir(self) -> Path:
        return self.out_dir / "work"


@dataclass
class StepResult:
    rate: float
    ok: bool
    arm: ArmResult
    reason: str = ""


@dataclass
class CaseResults:
    arms: list[ArmResult] = field(default_factory=list)
    steps: list[StepResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"arms": [a.to_dict() for a in self.arms],
                "steps": [{"rate": s.rate, "ok": s.ok, "reason": s.reason, **s.arm.to_dict()} for s in self.steps],
                "notes": self.notes}


@contextlib.contextmanager
def bench_stack(cfg: BenchConfig, policy: str, lmcache: bool,
                fleet_args: list[str] | None = None) -> Iterator[tuple[Stack, EnvoyProc]]:
    """The shipped stack plus a pass-through Envoy (no ext_proc) on spare ports in front of the same fleet."""
    stack = Stack(cfg.log_dir, engines=3, lmcache=lmcache,
                  fleet_args=FAST_FLEET if fleet_args is None else fleet_args,
                  sidecar_args=[*SIDECAR_COMMON, "--policy", policy])
    # Ports are shared with other runs on this machine: on a start failure wait and try again.
    start_with_retries(stack.start, attempts=cfg.start_retries, what=f"stack ({policy})", delay_s=15.0)
    try:
        alone = EnvoyProc(ENVOY_PASSTHROUGH_CONFIG, cfg.log_dir, listen_port=free_port(), admin_port=free_port())
        start_with_retries(alone.start, attempts=cfg.start_retries, what="pass-through envoy", delay_s=15.0)
        try:
            yield stack, alone
        finally:
            alone.stop()
    finally:
        stack.stop()


def _procs(stack: Stack, alone: EnvoyProc, arm_uses_sidecar: bool) -> dict[str, ManagedProc]:
    procs: dict[str, ManagedProc] = {}
    assert stack.envoy is not None and stack.sidecar is not None and stack.fleet is not None
    procs["envoy"] = stack.envoy if arm_uses_sidecar else alone
    procs["envoy_other"] = alone if arm_uses_sidecar else stack.envoy
    procs["sidecar"] = stack.sidecar
    procs["fleet"] = stack.fleet
    if stack.lmcache is not None:
        procs["lmcache"] = stack.lmcache
    return procs


def load_spec(cfg: BenchConfig, url: str, rate: float, duration: float, *, method: str = "POST",
          bodies: list[str] | None = None, bodies_file: str = "", seed: int = 1, stream: bool = False) -> LoadSpec:
    return LoadSpec(url=url, rate=rate, duration=duration, method=method, bodies=bodies or [],
                    bodies_file=bodies_file, arrivals=cfg.arrivals, seed=seed, connections=cfg.connections,
                    stream=stream)


def run_transport(cfg: BenchConfig, results: CaseResults) -> None:
    """1. tiny /v1/completions (max_tokens 1) and GET /v1/models: Envoy alone vs Envoy + sidecar (leastload)."""
    with bench_stack(cfg, "leastload", lmcache=False) as (stack, alone):
        sidecar = stack.sidecar
        body = tiny_body()
        for arm, url_base, uses in (("envoy_alone", alone.url, False), ("envoy+sidecar", stack.url, True)):
            spec = load_spec(cfg, f"{url_base}/v1/completions", cfg.rate, cfg.duration, bodies=[body])
            results.arms.append(measure("transport", arm, spec, _procs(stack, alone, uses), cfg.work_dir,
                                        sidecar=sidecar, warmup_s=cfg.warmup))
            log_arm(results.arms[-1])
        for arm, url_base, uses in (("envoy_alone", alone.url, False), ("envoy+sidecar", stack.url, True)):
            spec = load_spec(cfg, f"{url_base}/v1/models", cfg.rate, cfg.duration, method="GET")
            results.arms.append(measure("models_get", arm, spec, _procs(stack, alone, uses), cfg.work_dir,
                                        sidecar=sidecar, warmup_s=cfg.warmup))
            log_arm(results.arms[-1])


def decision_bodies_files(cfg: BenchConfig, max_tokens: int = 1, stream: bool = False) -> tuple[str, str]:
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    warm, measured = decision_bodies(max_tokens=max_tokens, stream=stream)
    tag = "-stream" if stream else ""
    warm_path, meas_path = cfg.work_dir / "bodies-warm.json", cfg.work_dir / f"bodies-decision{tag}.json"
    warm_path.write_text(json.dumps(warm))
    meas_path.write_text(json.dumps(measured))
    return str(warm_path), str(meas_path)


def run_decision(cfg: BenchConfig, results: CaseResults) -> None:
    """2. 1,578-token prompts over 64 shared prefixes, the default policy + LMCache, vs Envoy alone; 3. rate
    steps."""
    warm_file, bodies_file = decision_bodies_files(cfg)
    with bench_stack(cfg, AUTO, lmcache=True) as (stack, alone):
        sidecar = stack.sidecar
        url = f"{stack.url}/v1/completions"
        fill_caches(cfg, results, url, warm_file, "decision")
        if "decision" in cfg.cases:
            for arm, url_base, uses in (("envoy_alone", alone.url, False), ("envoy+sidecar", stack.url, True)):
                spec = load_spec(cfg, f"{url_base}/v1/completions", cfg.rate, cfg.duration, bodies_file=bodies_file)
                results.arms.append(measure("decision", arm, spec, _procs(stack, alone, uses), cfg.work_dir,
                                            sidecar=sidecar, warmup_s=cfg.warmup))
                log_arm(results.arms[-1])
        if "steps" in cfg.cases:
            procs = _procs(stack, alone, True)
            for rate in cfg.step_rates:
                spec = load_spec(cfg, url, rate, cfg.step_duration, bodies_file=bodies_file, seed=int(rate))
                step = measure("steps", f"{rate:g}/s", spec, procs, cfg.work_dir, sidecar=sidecar,
                               warmup_s=min(1.0, cfg.warmup))
                reasons = []
                if step.errors:
                    reasons.append(f"{step.errors} errors")
                if step.achieved_rate < cfg.step_min_achieved * rate:
                    reasons.append(f"achieved {step.achieved_rate:.0f}/s < {cfg.step_min_achieved:.0%}")
                if not step.latency["p99_ms"] <= cfg.step_p99_limit_ms:
                    reasons.append(f"p99 {step.latency['p99_ms']:.1f} ms > {cfg.step_p99_limit_ms:g} ms")
                results.steps.append(StepResult(rate, not reasons, step, "; ".join(reasons)))
                log_arm(step, "; ".join(reasons) or "sustained")
                failed = sum(1 for st in results.steps if not st.ok)
                # One more step after a latency-only failure shows where throughput itself gives out.
                if failed >= cfg.step_max_failures or any(not r.startswith("p99") for r in reasons):
                    break
                time.sleep(1.0)


def fill_caches(cfg: BenchConfig, results: CaseResults, url: str, warm_file: str, case: str) -> None:
    """Fill the engines' caches (and so LMCache) with every prefix, through the router under test."""
    fill = LoadSpec(url=url, rate=50, duration=64 / 50 + 0.5, bodies_file=warm_file, arrivals="fixed",
                    max_requests=64)
    filled = run_loadgen(fill, cfg.work_dir, f"{case}-fill")
    results.notes.append(f"{case} cache fill: {filled.ok}/{filled.scheduled} prefixes OK")
    time.sleep(0.5)  # admits travel to the controller over ZMQ asynchronously


def log_arm(a: ArmResult, extra: str = "") -> None:
    log.info("%-10s %-14s %5.0f/s n=%-6d err=%-4d p50=%.2fms p99=%.2fms sidecar=%.0fus/req envoy=%.0fus/req %s",
             a.case, a.arm, a.rate, a.requests, a.errors, a.latency["p50_ms"], a.latency["p99_ms"],
             a.cpu_us_per_request.get("sidecar", 0.0), a.cpu_us_per_request.get("envoy", 0.0), extra)


def as_dict(cfg: BenchConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["out_dir"] = str(cfg.out_dir)
    return d
