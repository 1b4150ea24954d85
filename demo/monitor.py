"""`make monitor`: the demo stack (Envoy, sidecar, 3 simulated engines) with a real Prometheus beside it.

    python -m demo.monitor [--seconds 600] [--prometheus-port 9090] [--rate 2]

Everything listens on loopback. Prometheus scrapes the sidecar, Envoy's stats and the engines every second
(with the `namespace` and `pool` labels a PodMonitor adds) and evaluates the PrometheusRule's alerts; a
light open loop of requests (shared prefixes, --rate per second) keeps the panels moving. It prints where to
look, then runs until --seconds pass or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from testkit import http
from testkit import prometheus as prom
from testkit.lmcache import LMCacheControllerProc
from testkit.paths import REPO
from testkit.ports import ENVOY_ADMIN_PORT
from testkit.stack import Stack

DEFAULT_LOG_DIR = REPO / "out" / "monitor" / "logs"
LABELS = {"namespace": "demo", "pool": "demo-pool"}
TOPICS = ["a support chat about billing", "a code review of a parser", "a summary of a long report",
          "questions about a product manual"]
EXAMPLES = ('sum by (outcome) (rate(loadaware_decisions_total[1m]))',
            'inference_pool_average_queue_size', 'ALERTS')


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def where_to_look(stack: Stack, prometheus: prom.PrometheusProc) -> str:
    assert stack.sidecar is not None and stack.envoy is not None
    graph = [f"  {prometheus.url}/graph?g0.expr={urllib.parse.quote(e)}&g0.tab=0" for e in EXAMPLES]
    return "\n".join([
        "where to look:",
        f"  Prometheus            {prometheus.url}   (targets: {prometheus.url}/targets, "
        f"alerts: {prometheus.url}/alerts)",
        *graph,
        f"  sidecar /metrics      http://{stack.sidecar.metrics_listen}/metrics",
        f"  sidecar /debug/state  {stack.sidecar.debug_url}/debug/state",
        f"  Envoy stats           {stack.envoy.admin_url}/stats/prometheus",
        f"  gateway               {stack.url}/v1/completions",
        f"  dashboard             {REPO / 'k8s' / 'monitoring' / 'loadaware-dashboard.json'} "
        f"(Grafana: Dashboards > New > Import; data source: a Prometheus at {prometheus.url})",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.monitor", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="stop after this long (default 600)")
    parser.add_argument("--prometheus-port", type=int, default=9090)
    parser.add_argument("--rate", type=float, default=2.0, help="requests per second (default 2)")
    parser.add_argument("--log-dir", type=Path, default=DEFAULT_LOG_DIR)
    args = parser.parse_args(argv)
    reason = prom.missing()
    if reason is not None:
        print(f"monitor: {reason}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    rng = random.Random(1)
    try:
        with Stack(args.log_dir, engines=3, lmcache=LMCacheControllerProc.available(), fleet_args=["--kv-events"],
                   sidecar_args=["--prefix-source", "lmcache,kv-events" if LMCacheControllerProc.available()
                                 else "kv-events"]) as stack:
            assert stack.fleet is not None and stack.sidecar is not None
            config = prom.scrape_config([
                {"job": "sidecar", "targets": [stack.sidecar.metrics_listen], "labels": LABELS},
                {"job": "envoy", "targets": [f"127.0.0.1:{ENVOY_ADMIN_PORT}"], "labels": LABELS,
                 "metrics_path": "/stats/prometheus"},
                {"job": "engines", "targets": stack.fleet.endpoints, "labels": LABELS}],
                rule_files=[prom.write_rules(args.log_dir)])
            with prom.PrometheusProc(config, args.log_dir, port=args.prometheus_port) as prometheus:
                print(where_to_look(stack, prometheus), flush=True)
                deadline = time.monotonic() + args.seconds
                sent = 0
                while time.monotonic() < deadline:
                    topic = rng.choice(TOPICS)
                    body = {"model": "tiny-model", "prompt": f"{topic}. " * 60 + f"turn {sent}", "max_tokens": 8}
                    http.request("POST", stack.url + "/v1/completions", json.dumps(body).encode(), timeout=20)
                    sent += 1
                    time.sleep(rng.expovariate(args.rate))
                print(f"monitor: sent {sent} requests; stopping", flush=True)
    except KeyboardInterrupt:
        print("monitor: interrupted; stopping", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
