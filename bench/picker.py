"""Case 7 (`picker`): streamed responses through the sidecar as an InferencePool's endpoint picker.

In one run, on one fleet and with the same bodies (`"stream": true`, `max_tokens` 64, `ignore_eos`), at the
fixed open-loop rate, three arms:

    (a) envoy_alone   Envoy without ext_proc (envoy/envoy-passthrough.yaml, on spare ports)
    (b) buffered      Envoy + sidecar in BUFFERED mode (envoy/envoy.yaml: the response does not cross it)
    (c) full_duplex   Envoy + sidecar in FULL_DUPLEX_STREAMED (envoy/envoy-inference-pool.yaml, Istio's
                      InferencePool filter: every response chunk crosses the sidecar and comes back)

Both Envoys with ext_proc talk to the same sidecar process (one port serves both modes), so (c) − (b) is what
streaming the response through the sidecar costs. The engines emit one SSE event per token, `picker_token_ms`
apart (real engines: tens of ms), so that each event reaches Envoy, and so the sidecar, as its own chunk;
without a gap Envoy reads several events at once and fewer, larger chunks cross (Envoy's ext_proc counters
show how many did). Prompts: "tiny" (the transport case's, policy leastload) and "decision" (the 1,578-token
prompts over 64 cached prefixes, the default policy + LMCache).

The stack binds the shipped fixed addresses (Envoy 10000/10001, sidecar 9002, engines 127.0.0.2-4:8000):
everything here runs under testkit's machine-wide loopback lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from loadaware.policies.auto import AUTO
from testkit.envoy import EnvoyProc
from testkit.loopback_lock import loopback_lock
from testkit.paths import REPO
from testkit.procs import ManagedProc
from testkit.retry import start_with_retries

from .cases import (
    FAST_FLEET,
    BenchConfig,
    CaseResults,
    bench_stack,
    decision_bodies_files,
    fill_caches,
    load_spec,
    log_arm,
)
from .measure import measure
from .workload import tiny_body

log = logging.getLogger("bench")

POOL_CONFIG = REPO / "envoy" / "envoy-inference-pool.yaml"
ARMS = ("envoy_alone", "buffered", "full_duplex")
# prompt -> (case name, sidecar policy, LMCache)
PROMPTS: dict[str, tuple[str, str, bool]] = {
    "tiny": ("picker", "leastload", False),
    "decision": ("picker_decision", AUTO, True),
}


def ext_proc_counters(stats: Mapping[str, float]) -> dict[str, float]:
    """Envoy's ext_proc counters (`http.<stat_prefix>.ext_proc.<name>`) by name, summed over listeners."""
    out: dict[str, float] = {}
    for key, value in stats.items():
        _, sep, name = key.partition(".ext_proc.")
        if sep and key.startswith("http."):
            out[name] = out.get(name, 0.0) + float(value)
    return out


def picker_fleet(cfg: BenchConfig) -> list[str]:
    """The other cases' fast engines, with a gap between tokens (a later flag wins in argparse)."""
    return [*FAST_FLEET, "--decode-base-ms", f"{cfg.picker_token_ms:g}", "--decode-per-seq-ms", "0"]


def _counters_of(envoy: EnvoyProc) -> Callable[[], dict[str, float]]:
    def read() -> dict[str, float]:
        return ext_proc_counters(envoy.stats())

    return read


def run_picker(cfg: BenchConfig, results: CaseResults) -> None:
    unknown = [p for p in cfg.picker_prompts if p not in PROMPTS]
    if unknown:
        raise ValueError(f"unknown picker prompt(s) {unknown}; expected {tuple(PROMPTS)}")
    for prompt in cfg.picker_prompts:
        case, policy, lmcache = PROMPTS[prompt]
        bodies: list[str] = []
        bodies_file = warm_file = ""
        if prompt == "decision":
            warm_file, bodies_file = decision_bodies_files(cfg, max_tokens=cfg.picker_tokens, stream=True)
        else:
            bodies = [tiny_body(cfg.picker_tokens, stream=True)]
        # Stack takes the lock too (it is reentrant); held here as well, the picker's Envoy on 10001/9911 is
        # covered from before the stack starts until after it is gone.
        with loopback_lock(), bench_stack(cfg, policy, lmcache, picker_fleet(cfg)) as (stack, alone):
            assert stack.envoy is not None and stack.sidecar is not None and stack.fleet is not None
            pool = EnvoyProc(POOL_CONFIG, cfg.log_dir)
            start_with_retries(pool.start, attempts=cfg.start_retries, what="inference-pool envoy", delay_s=15.0)
            try:
                if warm_file:
                    fill_caches(cfg, results, f"{stack.url}/v1/completions", warm_file, case)
                envoys: dict[str, EnvoyProc] = {"envoy_alone": alone, "buffered": stack.envoy, "full_duplex": pool}
                for arm in ARMS:
                    envoy = envoys[arm]
                    procs: dict[str, ManagedProc] = {"envoy": envoy, "sidecar": stack.sidecar, "fleet": stack.fleet}
                    if stack.lmcache is not None:
                        procs["lmcache"] = stack.lmcache
                    for other, proc in envoys.items():
                        if other != arm:
                            procs[f"envoy_idle_{other}"] = proc
                    spec = load_spec(cfg, f"{envoy.url}/v1/completions", cfg.rate, cfg.duration, bodies=bodies,
                                 bodies_file=bodies_file, stream=True)
                    results.arms.append(measure(case, arm, spec, procs, cfg.work_dir, sidecar=stack.sidecar,
                                                warmup_s=cfg.warmup, counters=_counters_of(envoy)))
                    a = results.arms[-1]
                    log_arm(a, f"events/resp={a.sse_events_per_response:.1f} "
                                f"ext_proc msgs={a.counters.get('stream_msgs_sent', 0.0):.0f}")
            finally:
                pool.stop()
