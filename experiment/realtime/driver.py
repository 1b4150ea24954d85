"""Real-time experiment: seeds x arms through the real stack on loopback.

    python -m experiment.realtime.driver --point reference --seeds 1-3 --arms all --out out/experiment/rt

One fleet (the simulated engines with the calibrated service model, a real LMCache controller, KV events
on), one Envoy (the shipped config, its engines cluster pointed at this fleet) for the whole run. For each
seed, for each arm (the order rotates with the seed so no arm always runs first or last after a reset):

1. wait until the fleet is idle, clear every engine's caches, wait until LMCache credits nobody;
2. start the arm's router: the sidecar with the arm's flags (Envoy stays up and reconnects to it), or a
   peer router on a free port;
3. run the open-loop sender in its own process (warm-up through that router, then the measured requests,
   scraping the engines), bounded in time;
4. read the router's own counters (a sidecar arm must have decided every request it was sent), stop it,
   compute the seed's metrics (experiment.metrics) and append them to per_seed.csv.

The whole run holds `loopback_lock()` (fixed ports: Envoy :10000/:9901, or :10001/:9911 with `--gateway
picker`, sidecar :9002, engines 127.0.0.2-.N:8000, KV events :5557/:5558) and stops every process it started
on any exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from experiment.metrics import median_of, seed_metrics
from experiment.realtime import outputs
from experiment.realtime.arms import DEFAULT_ARMS, RealArm, parse_arms
from experiment.realtime.envoycfg import engines_config
from experiment.realtime.fleetctl import reset_caches, service_flags, wait_idle, wait_lmcache_empty
from experiment.realtime.points import OperatingPoint, point_by_name
from experiment.realtime.scrape import sum_by_label
from experiment.realtime.sender import SenderResult, SenderSpec, result_from_json
from experiment.workload import build
from sim.fleet import engine_ips
from sim.service_model import ServiceModel
from testkit.envoy import EnvoyProc
from testkit.fleet import FleetProc
from testkit.lmcache import LMCacheControllerProc
from testkit.loopback_lock import loopback_lock
from testkit.paths import ENVOY_CONFIG, REPO, TINY_TOKENIZER, python, repo_env
from testkit.peers import PEER_VERSIONS, PeerProc
from testkit.ports import (
    ENVOY_ADMIN_PORT,
    ENVOY_LISTEN_PORT,
    PICKER_ADMIN_PORT,
    PICKER_LISTEN_PORT,
    SIDECAR_PORT,
    free_port,
    wait_addresses_free,
)
from testkit.procs import ManagedProc, ProcError
from testkit.sidecar import SidecarProc

# `make experiment-quick`: sized to finish in under 15 minutes on the 2-core machine (see docs/results.md).
# The warm-up goes at twice the offered rate there: it is half of a short run's wall time otherwise.
# One warm-up pass, not the reference's two: the cold pass is prefill-bound (~25 s at any rate), and the
# 18 runs must fit the 15-minute budget (~46 s each).
QUICK: dict[str, Any] = {"seeds": "1-3", "arms": "quick", "n_requests": 240, "warmup_rate": 32.0,
                         "warmup_passes": 1}
ENGINE_BASE_IP = "127.0.0.2"
ENGINE_PORT = 8000
KV_EVENTS_PORT, KV_EVENTS_REPLAY_PORT = 5557, 5558  # sim.fleet's defaults, on every engine's ip
# The gateway in front of the sidecar arms. `buffered`: envoy/envoy.yaml (one ext_proc message per request
# side: the sidecar never sees a response chunk, so first tokens are estimated from the engines' TTFT
# counters). `picker`: envoy/envoy-inference-pool.yaml (the Endpoint Picker Protocol's FULL_DUPLEX_STREAMED:
# the sidecar sees each request's first response chunk, which `predictive`'s TTFT model learns from, at the
# price of one ext_proc message per response chunk).
Gateway = Literal["buffered", "picker"]
GATEWAYS: dict[Gateway, Path] = {"buffered": ENVOY_CONFIG, "picker": REPO / "envoy" / "envoy-inference-pool.yaml"}


@dataclass
class DriverConfig:
    point: OperatingPoint
    arms: list[RealArm]
    seeds: list[int]
    out: Path
    scrape_interval_s: float = 0.5
    resume: bool = False
    max_minutes: float | None = None  # stop starting new runs after this much wall time
    lock_timeout_s: float = 1800.0
    sidecar_extra: list[str] = field(default_factory=list)
    gateway: Gateway = "buffered"

    @property
    def needs_lmcache(self) -> bool:
        return any(a.kind == "sidecar" and a.prefix_source in ("lmcache", "default") for a in self.arms)

    @property
    def needs_kv_events(self) -> bool:
        return any(a.kind == "sidecar" and a.prefix_source == "kv-events" for a in self.arms)

    @property
    def needs_envoy(self) -> bool:
        return any(a.kind == "sidecar" for a in self.arms)


def parse_seeds(spec: str) -> list[int]:
    """"1-20", "1,3,5", "2-4,9" -> sorted unique seeds."""
    seeds: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            seeds.update(range(int(lo), int(hi) + 1))
        else:
            seeds.add(int(part))
    if not seeds:
        raise ValueError("no seeds")
    return sorted(seeds)


def rotated(arms: Sequence[RealArm], k: int) -> list[RealArm]:
    k %= max(1, len(arms))
    return list(arms[k:]) + list(arms[:k])


class Fleet:
    """The long-lived part of the stack: LMCache controller, engines, Envoy."""

    def __init__(self, cfg: DriverConfig, logs: Path) -> None:
        self.cfg = cfg
        self.logs = logs
        self.exit = contextlib.ExitStack()
        self.lmcache: LMCacheControllerProc | None = None
        self.fleet: FleetProc | None = None
        self.envoy: EnvoyProc | None = None
        self.engines: dict[str, str] = {}  # name -> base URL
        self.endpoints: list[str] = []  # HOST:PORT as Envoy and the sidecar name them

    def fixed_addresses(self) -> list[tuple[str, int]]:
        ips = engine_ips(ENGINE_BASE_IP, self.cfg.point.engines)
        envoy = ((PICKER_LISTEN_PORT, PICKER_ADMIN_PORT) if self.cfg.gateway == "picker"
                 else (ENVOY_LISTEN_PORT, ENVOY_ADMIN_PORT))
        return ([("127.0.0.1", port) for port in (*envoy, SIDECAR_PORT)]
                + [(ip, port) for ip in ips for port in (ENGINE_PORT, KV_EVENTS_PORT, KV_EVENTS_REPLAY_PORT)])

    def wait_addresses_free(self, timeout: float) -> None:
        """A run that does not share our lock (another checkout with another TMPDIR) may hold the fixed
        addresses: wait until nothing listens on any of them (testkit.ports.wait_addresses_free says why)."""

        def report(busy: list[str]) -> None:
            print(f"[experiment] waiting for another run to free {', '.join(busy[:4])} ...", flush=True)

        try:
            wait_addresses_free(self.fixed_addresses(), timeout, poll_s=15.0, on_busy=report)
        except TimeoutError as e:
            raise ProcError(str(e)) from None

    def start(self) -> None:
        try:
            self.exit.enter_context(loopback_lock(self.cfg.lock_timeout_s))
            self.wait_addresses_free(self.cfg.lock_timeout_s)
            if self.cfg.needs_lmcache:
                self.lmcache = self.exit.enter_context(LMCacheControllerProc(self.logs))
            extra = service_flags(self.cfg.point.service)
            if self.cfg.needs_kv_events:
                extra.append("--kv-events")
            self.fleet = self.exit.enter_context(
                FleetProc(self.logs, engines=self.cfg.point.engines, base_ip=ENGINE_BASE_IP, port=ENGINE_PORT,
                          tokenizer=TINY_TOKENIZER, lmcache=self.lmcache, extra_args=extra))
            self.engines = {e["name"]: e["url"] for e in self.fleet.engines}
            self.endpoints = self.fleet.endpoints
            if self.cfg.needs_envoy:
                self.envoy = self.exit.enter_context(
                    EnvoyProc(engines_config(self.endpoints, self.logs, GATEWAYS[self.cfg.gateway]), self.logs))
        except BaseException:
            self.exit.close()
            raise

    def stop(self) -> None:
        self.exit.close()

    def procs(self) -> dict[str, ManagedProc]:
        return {n: p for n, p in (("fleet", self.fleet), ("envoy", self.envoy), ("lmcache", self.lmcache))
                if p is not None and p.running}


def _cpu(procs: dict[str, ManagedProc]) -> dict[str, float]:
    out = {}
    for name, p in procs.items():
        with contextlib.suppress(OSError, ProcError):
            out[name] = p.cpu_seconds()
    return out


@contextlib.contextmanager
def router_for(arm: RealArm, fleet: Fleet, log_dir: Path, extra: Sequence[str]) -> Iterator[tuple[str, ManagedProc]]:
    """Start the arm's router; yields (URL the sender targets, the router process)."""
    if arm.kind == "peer":
        assert arm.peer is not None
        with PeerProc(arm.peer, list(fleet.engines.values()), log_dir, policy=arm.policy) as peer:
            yield peer.url, peer
        return
    assert fleet.envoy is not None
    args = ["--listen", f"127.0.0.1:{SIDECAR_PORT}", "--endpoints", ",".join(fleet.endpoints),
            "--tokenizer", str(TINY_TOKENIZER), "--metrics-listen", f"127.0.0.1:{free_port()}",
            "--log-level", "warning", *arm.sidecar_args()]
    if fleet.lmcache is not None:
        args += ["--lmcache-url", fleet.lmcache.url]
    with SidecarProc([*args, *extra], log_dir=log_dir) as sidecar:
        yield fleet.envoy.url, sidecar


def sidecar_counters(proc: ManagedProc) -> dict[str, Any]:
    """Decisions by outcome, fallbacks by reason and each engine's observed TTFT (the EWMA of first response
    chunks the sidecar saw: present with `--gateway picker` only), from the sidecar's /metrics (empty for peers)."""
    if not isinstance(proc, SidecarProc):
        return {}
    try:
        text = proc.metrics_text()
    except (ProcError, OSError):
        return {"error": "metrics unavailable"}
    return {"decisions": sum_by_label(text, "loadaware_decisions_total", "outcome"),
            "fallbacks": sum_by_label(text, "loadaware_fallbacks_total", "reason"),
            "observed_ttft_s": sum_by_label(text, "loadaware_endpoint_observed_ttft_seconds", "endpoint"),
            # What lane-spread measured its gate on (0 for other policies but the capacity).
            "working_set": {name: sum(sum_by_label(text, f"loadaware_{name}", "").values()) for name in
                            ("fleet_kv_capacity_tokens", "prefix_working_set_tokens", "prefix_working_set_new_heads")}}


def run_one(cfg: DriverConfig, fleet: Fleet, arm: RealArm, seed: int) -> dict[str, Any]:
    point = cfg.point
    rdir = outputs.run_dir(cfg.out, arm.name, seed)
    rdir.mkdir(parents=True, exist_ok=True)
    log_dir = cfg.out / "logs" / f"{arm.name}-seed{seed}"
    t_start = time.monotonic()
    wait_idle(fleet.engines)
    dropped = reset_caches(fleet.engines)
    if fleet.lmcache is not None:
        probes = build(point.workload, seed).prefix_ids[:8]
        wait_lmcache_empty(fleet.lmcache.url, probes)
    spec = SenderSpec(url="", seed=seed, workload=_workload_json(point), engines=fleet.engines,
                      scrape_interval_s=cfg.scrape_interval_s, warmup=point.agentic is None,
                      agentic=asdict(point.agentic) if point.agentic is not None else None)
    load0 = os.getloadavg()[0]
    with router_for(arm, fleet, log_dir, cfg.sidecar_extra) as (url, router):
        spec.url = url
        spec_path = rdir / "sender-spec.json"
        spec_path.write_text(json.dumps(spec.__dict__))
        out_path = rdir / "sender.json"
        out_path.unlink(missing_ok=True)
        procs = {**fleet.procs(), "router": router}
        cpu0, t0 = _cpu(procs), time.monotonic()
        bound = _run_bound_s(point)
        with open(log_dir / "sender.log", "wb") as log:
            proc = subprocess.run([python(), "-m", "experiment.realtime.sender", str(spec_path), str(out_path)],
                                  cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=bound,
                                  env={**repo_env(), "PYTHONUNBUFFERED": "1"})
        wall = time.monotonic() - t0
        cpu1 = _cpu(procs)
        counters = sidecar_counters(router)
        router_alive = router.running
    if proc.returncode != 0 or not out_path.exists():
        raise ProcError(f"sender failed for {arm.name} seed {seed} (rc={proc.returncode}); see {log_dir}/sender.log")
    result = result_from_json(out_path.read_text())
    run = outputs.run_records(result, arm.name, seed, point.workload.rate)
    m = seed_metrics(run)
    decided = sum(counters.get("decisions", {}).values()) if arm.kind == "sidecar" else None
    expected = result.warmup_sent + m.sent
    # Every request of a sidecar arm must have been decided by OUR sidecar: a foreign Envoy or sidecar
    # sharing the fixed ports (SO_REUSEPORT) would take some, and the run would silently mix two stacks.
    suspect = decided is not None and decided != expected
    if suspect:
        print(f"[experiment] WARNING {arm.name} seed {seed}: the sidecar decided {decided:g} of {expected} "
              "requests; another stack may have shared the fixed ports (run kept, marked suspect)", flush=True)
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu1 if k in cpu0}
    cpu["sender"] = result.cpu_s
    info = {"arm": arm.name, "seed": seed, "point": point.name, "router": arm.kind, "url": spec.url,
            "wall_s": wall, "total_s": time.monotonic() - t_start, "cpu_s": cpu,
            "cpu_share": {k: v / wall for k, v in cpu.items()}, "loadavg_before": load0,
            "loadavg_after": os.getloadavg()[0], "cache_blocks_cleared": dropped, "router_counters": counters,
            "router_alive_at_end": router_alive, "warmup_sent": result.warmup_sent,
            "warmup_errors": result.warmup_errors, "warmup_wall_s": result.warmup_wall_s,
            "measure_wall_s": result.measure_wall_s, "launch_lag_p99_ms": result.launch_lag_p99_ms,
            "launch_lag_max_ms": result.launch_lag_max_ms, "scrape_errors": result.scrape_errors,
            "errors": result.errors, "decided_by_sidecar": decided, "suspect": suspect, "metrics": m.row()}
    if point.agentic is not None:
        info["agentic"] = agentic_summary(result)
    outputs.write_run(cfg.out, arm.name, seed, result, info)
    outputs.append_seed_metrics(cfg.out, m)
    return info


def agentic_summary(result: SenderResult) -> dict[str, Any]:
    """An agentic run's figures: TTFT p50/p95 of the turns that answered, and the Responses follow-ups that
    answered 200 at once (reached the engine holding their state)."""
    ttfts = sorted(r.ttft for r in result.requests if r.ok and r.ttft is not None)

    def pct(q: float) -> float:
        return ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] if ttfts else float("nan")

    extra = result.extra
    follow_ups = int(extra.get("follow_ups", 0))
    return {"ttft_p50": pct(0.50), "ttft_p95": pct(0.95), "turns_ok": len(ttfts), "turns": len(result.requests),
            "follow_ups": follow_ups, "follow_ups_200": int(extra.get("follow_ups_200", 0)),
            "follow_up_statuses": extra.get("follow_up_statuses", {}),
            "reached_share": extra.get("follow_ups_200", 0) / follow_ups if follow_ups else float("nan")}


def _workload_json(point: OperatingPoint) -> dict[str, Any]:
    return dict(point.describe()["workload"])


def _run_bound_s(point: OperatingPoint) -> float:
    """Hard wall bound of one sender: warm-up + measured phase at their rates, plus generous drains."""
    if point.agentic is not None:
        return 3 * 300 + 120  # the sender bounds its sessions at twice its drain timeout
    wl = point.workload
    warm = wl.warmup_passes * (wl.n_prefixes / (wl.warmup_rate or wl.rate) + 60)
    return warm + wl.n_requests / wl.rate + 2 * 300 + 120


def _line(info: dict[str, Any]) -> str:
    if "agentic" in info:
        a = info["agentic"]
        return (f"{info['arm']:<22} seed {info['seed']:>2}  agentic: ttft p50 {a['ttft_p50']:.3f}s p95 "
                f"{a['ttft_p95']:.3f}s  turns ok {a['turns_ok']}/{a['turns']}  follow-ups 200 "
                f"{a['follow_ups_200']}/{a['follow_ups']} {a['follow_up_statuses']}  wall {info['wall_s']:5.1f}s")
    m = info["metrics"]
    share = info["cpu_share"]
    return (f"{info['arm']:<22} seed {info['seed']:>2}  imb {m['imbalance']:6.3f}  hit {m['prefix_hit_rate']:.3f}  "
            f"ttft p95 {m['ttft_p95']:7.3f}s mean {m['ttft_mean']:.3f}s  itl p50 {1000 * m['itl_p50']:5.1f}ms  "
            f"slo miss {m['slo_miss']:.3f}  err {m['error_rate']:.3f}  thr {m['throughput_req_s']:5.2f}/s  "
            f"wall {info['wall_s']:5.1f}s  cpu fleet {share.get('fleet', 0):.0%} router {share.get('router', 0):.0%} "
            f"envoy {share.get('envoy', 0):.0%} sender {share.get('sender', 0):.0%}  load {info['loadavg_after']:.1f}")


def run_experiment(cfg: DriverConfig) -> list[dict[str, Any]]:
    cfg.out.mkdir(parents=True, exist_ok=True)
    logs = cfg.out / "logs"
    config = {"mode": "realtime", "point": cfg.point.describe(), "arms": [a.__dict__ for a in cfg.arms],
              "seeds": cfg.seeds, "scrape_interval_s": cfg.scrape_interval_s, "gateway": cfg.gateway,
              "peers": PEER_VERSIONS,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version()},
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (cfg.out / outputs.CONFIG).write_text(json.dumps(config, indent=1, default=str))
    t0 = time.monotonic()
    infos: list[dict[str, Any]] = []
    fleet = Fleet(cfg, logs)
    print(f"[experiment] {cfg.point.name}: {cfg.point.engines} engines, {len(cfg.arms)} arms x "
          f"{len(cfg.seeds)} seeds -> {cfg.out}", flush=True)
    fleet.start()
    try:
        print(f"[experiment] fleet up in {time.monotonic() - t0:.1f}s: {', '.join(fleet.endpoints)}", flush=True)
        for i, seed in enumerate(cfg.seeds):
            for arm in rotated(cfg.arms, i):
                if cfg.resume and (outputs.run_dir(cfg.out, arm.name, seed) / "run.json").exists():
                    continue
                if cfg.max_minutes is not None and time.monotonic() - t0 > 60 * cfg.max_minutes:
                    print(f"[experiment] --max-minutes {cfg.max_minutes:g} reached; stopping", flush=True)
                    return infos
                info = run_one(cfg, fleet, arm, seed)
                infos.append(info)
                print(_line(info), flush=True)
    finally:
        fleet.stop()
        total = time.monotonic() - t0
        (cfg.out / "wall.json").write_text(json.dumps({"wall_s": total, "runs": len(infos)}))
        print(f"[experiment] {len(infos)} runs in {total:.0f}s", flush=True)
    return infos


def summary_table(out: Path) -> str:
    per_seed = outputs.load_per_seed(out)
    cols = ("imbalance", "ttft_p95", "prefix_hit_rate", "slo_miss", "ttft_mean", "error_rate")
    lines = [f"{'arm':<22} {'n':>3} " + " ".join(f"{c:>15}" for c in cols)]
    for arm, seeds in per_seed.items():
        ms = list(seeds.values())
        lines.append(f"{arm:<22} {len(ms):>3} " + " ".join(f"{median_of(ms, c):>15.4g}" for c in cols))
    return "\n".join(lines)


def _service_overrides(svc: ServiceModel, items: Sequence[str]) -> ServiceModel:
    changes: dict[str, Any] = {}
    types = {f.name: f.type for f in fields(ServiceModel)}
    for item in items:
        key, _, value = item.partition("=")
        if key not in types:
            raise SystemExit(f"--sm: unknown service-model field {key!r}")
        changes[key] = int(value) if types[key] in ("int", int) else float(value)
    return replace(svc, **changes)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiment.realtime.driver", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"`make experiment-quick`: seeds {QUICK['seeds']}, arms {QUICK['arms']}, "
                        f"{QUICK['n_requests']} requests per seed, {QUICK['warmup_passes']} warm-up pass at "
                        f"{QUICK['warmup_rate']:g} req/s "
                        "(explicit flags win)")
    p.add_argument("--point", default="reference", help="reference | queueing | tiny | h015 | agentic")
    p.add_argument("--arms", default=None, help=f"comma list, or all ({','.join(DEFAULT_ARMS)}) or quick")
    p.add_argument("--seeds", default=None, help="e.g. 1-20 or 1,2,5 (default 1-3)")
    p.add_argument("--out", type=Path, default=REPO / "out" / "experiment" / "realtime")
    p.add_argument("--n-requests", type=int, default=None, help="override the point's requests per seed")
    p.add_argument("--rate", type=float, default=None, help="override the point's offered rate (req/s)")
    p.add_argument("--engines", type=int, default=None, help="override the point's fleet size")
    p.add_argument("--warmup-rate", type=float, default=None, help="warm-up arrivals per second (default: --rate)")
    p.add_argument("--warmup-passes", type=int, default=None,
                   help="warm-up passes over all prefixes through the router under test (default 2)")
    p.add_argument("--sm", action="append", default=[], metavar="FIELD=VALUE",
                   help="override one service-model field (repeatable), e.g. --sm decode_base_ms=20")
    p.add_argument("--scrape-interval-s", type=float, default=0.5)
    p.add_argument("--gateway", choices=sorted(GATEWAYS), default="buffered",
                   help="Envoy config of the sidecar arms: buffered (envoy.yaml) or picker (envoy-inference-pool.yaml)")
    p.add_argument("--resume", action="store_true", help="skip (arm, seed) pairs already in --out")
    p.add_argument("--max-minutes", type=float, default=None, help="start no new run after this long")
    return p


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so every `finally` stops the processes this run started (the engines,
    # Envoy and LMCache run in their own sessions and would otherwise outlive a killed driver).
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    if args.quick:
        args.seeds = args.seeds or QUICK["seeds"]
        args.arms = args.arms or QUICK["arms"]
        args.n_requests = args.n_requests or QUICK["n_requests"]
        args.warmup_rate = args.warmup_rate or QUICK["warmup_rate"]
        args.warmup_passes = args.warmup_passes or QUICK["warmup_passes"]
    args.seeds, args.arms = args.seeds or "1-3", args.arms or "all"
    point = point_by_name(args.point, n_requests=args.n_requests, rate=args.rate, engines=args.engines,
                          warmup_rate=args.warmup_rate, warmup_passes=args.warmup_passes)
    if args.sm:
        point = replace(point, service=_service_overrides(point.service, args.sm),
                        source=point.source + " + --sm " + " ".join(args.sm))
    cfg = DriverConfig(point=point, arms=parse_arms(args.arms), seeds=parse_seeds(args.seeds), out=args.out,
                       scrape_interval_s=args.scrape_interval_s, resume=args.resume, max_minutes=args.max_minutes,
                       gateway=args.gateway)
    if not args.resume and (cfg.out / outputs.PER_SEED).exists():
        (cfg.out / outputs.PER_SEED).unlink()  # a fresh run does not mix with an older one's rows
    run_experiment(cfg)
    print(summary_table(cfg.out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
