"""The simulated fleet between runs: its command-line model flags, a cold start for every (arm, seed).

Every run must start from the same engine state, or the paired comparison compares histories: the GPU
prefix cache and the LMCache store are cleared through each engine's `POST /sim/reset_cache` (which also
reports the evictions to the LMCache controller and publishes `AllBlocksCleared` on the KV-events feed),
and the driver waits until no engine runs or queues anything and the controller credits nobody for the
run's prefixes. Counters (prefix queries/hits) keep counting: the metrics use deltas over the window.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import fields

from experiment.realtime.scrape import RUNNING, WAITING, parse_engine_metrics
from sim.service_model import ServiceModel
from testkit import http
from testkit.procs import ProcError


def service_flags(svc: ServiceModel) -> list[str]:
    """`python -m sim.fleet` flags (sim.service_model.add_cli_flags) for every field that differs from the
    simulator's default: the engines then run exactly `svc`, and the command line shows what was tuned."""
    default = ServiceModel()
    out: list[str] = []
    for f in fields(svc):
        value = getattr(svc, f.name)
        if value != getattr(default, f.name):
            out += ["--" + f.name.replace("_", "-"), f"{value}"]
    return out


def reset_caches(engines: Mapping[str, str]) -> int:
    """Clear every engine's caches; returns the number of cached blocks dropped (for the log)."""
    dropped = 0
    for name, url in engines.items():
        status, body = http.request("POST", f"{url}/sim/reset_cache", b"{}", timeout=5.0)
        if status != 200:
            raise ProcError(f"{name}: /sim/reset_cache -> HTTP {status}: {body[:200]!r}")
        dropped += int(json.loads(body).get("cleared_blocks", 0))
    return dropped


def engine_loads(engines: Mapping[str, str]) -> dict[str, tuple[float, float]]:
    out = {}
    for name, url in engines.items():
        status, body = http.request("GET", f"{url}/metrics", timeout=5.0)
        if status != 200:
            raise ProcError(f"{name}: /metrics -> HTTP {status}")
        v = parse_engine_metrics(body.decode())
        out[name] = (v.get(RUNNING, 0.0), v.get(WAITING, 0.0))
    return out


def wait_idle(engines: Mapping[str, str], timeout: float = 120.0) -> None:
    """Until no engine has a running or waiting request (a previous run's stragglers must not overlap)."""
    deadline = time.monotonic() + timeout
    while True:
        loads = engine_loads(engines)
        if all(r == 0 and w == 0 for r, w in loads.values()):
            return
        if time.monotonic() > deadline:
            raise ProcError(f"engines still busy after {timeout:.0f}s: {loads}")
        time.sleep(0.2)


def wait_lmcache_empty(lmcache_url: str, probes: Sequence[Sequence[int]], timeout: float = 30.0) -> None:
    """Until the controller credits nobody for any probe prompt (evictions travel over ZMQ, asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        held = []
        for tokens in probes:
            status, body = http.request("POST", f"{lmcache_url}/lookup", json.dumps({"tokens": list(tokens)}).encode(),
                                 timeout=5.0)
            if status == 200 and json.loads(body).get("layout_info"):
                held.append(json.loads(body)["layout_info"])
        if not held:
            return
        if time.monotonic() > deadline:
            raise ProcError(f"LMCache still credits {held[:2]} after reset")
        time.sleep(0.2)
