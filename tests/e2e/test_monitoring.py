"""The dashboard and the alerts against a real Prometheus scraping a running stack (Envoy, sidecar, 3 engines).

Prometheus (Debian's package, run on 127.0.0.1 by testkit/prometheus.py) scrapes the sidecar, Envoy's stats
and the simulated engines with the `namespace` and `pool` target labels a PodMonitor would add. Traffic
exercises what the panels show: routed requests with shared prefixes, a body without a prompt (a fallback),
an unknown model (an EPP BadRequest), queued phantom load, one request to an emptied fleet (no_endpoints),
lost KV-event batches (a gap and its replay), and an engine address where nothing listens (scrape failures,
an `unreachable` ejection, a KV-event feed that never connects). Then every panel query
and every alert expression runs through the HTTP API with the dashboard's variables substituted as Grafana
would, and each must return series.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit import http
from testkit import prometheus as prom
from testkit.metrics_text import metric_sum, samples
from testkit.paths import REPO
from testkit.ports import ENVOY_ADMIN_PORT
from testkit.prometheus import PrometheusProc, require_prometheus
from testkit.stack import Stack
from tests.conftest import wait_until

SCRAPE_S = 1.0  # Prometheus's scrape interval here

pytestmark = pytest.mark.e2e

DASHBOARD = REPO / "k8s" / "monitoring" / "loadaware-dashboard.json"
GOLDEN = REPO / "tests" / "fixtures" / "metrics-golden.txt"
ENGINES = ["127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000"]  # the fleet's default addresses
DEAD = "127.0.0.9:8000"  # nothing listens here
NAMESPACE, POOL = "loadaware-test", "test-pool"
RATE_INTERVAL = "30s"  # what Grafana's $__rate_interval would be for a 1 s scrape, generously
SELECTOR = re.compile(r"\b((?:loadaware|envoy|inference|vllm)[a-z0-9_:]*)(\{[^}]*\})?")
WORDS = ["cache", "prefix", "engine", "router", "token", "query", "answer", "batch", "model", "score"]


@dataclass
class Monitored:
    stack: Stack
    prometheus: PrometheusProc
    traffic_s: float
    endpoints_file: Path


def prompt(topic: int, extra: int) -> str:
    shared = " ".join(WORDS[(topic * 3 + i) % len(WORDS)] for i in range(300))
    return f"{shared} question {extra}"


def complete(stack: Stack, body: dict[str, Any]) -> int:
    status, _ = http.request("POST", stack.url + "/v1/completions", json.dumps(body).encode(), timeout=20)
    return status


def complete_as(stack: Stack, objective: str) -> int:
    """A completion naming an objective (admission reads its priority)."""
    req = urllib.request.Request(stack.url + "/v1/completions", method="POST", headers={
        "Content-Type": "application/json", "x-gateway-inference-objective": objective},
        data=json.dumps({"model": "tiny-model", "prompt": prompt(9, 0), "max_tokens": 4}).encode())
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def admission_traffic(stack: Stack) -> None:
    """Every engine queueing: a sheddable request is held past its time to live (429), a standard one too (placed
    anyway), another is held until an engine's queue empties (released)."""
    assert stack.fleet is not None
    engines = stack.fleet.engines
    for engine in engines:
        http.post_json(f"{engine['url']}/sim/phantom_load", {"running": 2, "waiting": 3})
    wait_until(lambda: sidecar_metric(stack, "loadaware_engine_waiting") == 3 * len(engines),
               message="the sidecar to scrape every engine queueing")
    assert complete_as(stack, "batch") == 429
    assert complete_as(stack, "standard") == 200
    with ThreadPoolExecutor(1) as pool:
        standard = pool.submit(complete_as, stack, "standard")
        wait_until(lambda: sidecar_metric(stack, "loadaware_flow_control_queue_size", priority="0") == 1,
                   message="the standard request to be held")
        http.post_json(f"{engines[-1]['url']}/sim/phantom_load", {"running": 0, "waiting": 0})
        assert standard.result(timeout=20) == 200


def sidecar_metric(stack: Stack, name: str, **labels: str) -> float:
    assert stack.sidecar is not None
    return metric_sum(stack.sidecar.metrics_text(), name, labels)


def drive(stack: Stack, endpoints_file: Path) -> None:
    """Bounded loopback traffic (~60 requests, one at a time) that gives every panel something to show."""
    assert stack.fleet is not None
    admission_traffic(stack)  # leaves the first two engines queueing, the last one not
    for engine in stack.fleet.engines[:2]:  # queued work the engines report (and the EPP gauges average)
        http.post_json(f"{engine['url']}/sim/phantom_load", {"running": 2, "waiting": 3})
    for i in range(40):
        assert complete(stack, {"model": "tiny-model", "prompt": prompt(i % 4, i), "max_tokens": 4}) == 200
    assert complete(stack, {"model": "tiny-model", "max_tokens": 4}) in (200, 400)  # no prompt: a fallback
    assert complete(stack, {"model": "no-such-model", "prompt": "hello", "max_tokens": 4}) == 404
    # An empty fleet for one request (no_endpoints), then the fleet back with an address nobody answers (not
    # before the unknown model: an engine whose models are unknown counts as serving any model).
    endpoints_file.write_text("# nobody\n")
    wait_until(lambda: sidecar_metric(stack, "loadaware_endpoints") == 0, message="the fleet to empty")
    complete(stack, {"model": "tiny-model", "prompt": prompt(0, 99), "max_tokens": 4})  # Envoy's fallback routes
    endpoints_file.write_text("\n".join([*ENGINES, DEAD]) + "\n")
    wait_until(lambda: sidecar_metric(stack, "loadaware_endpoints") == len(ENGINES) + 1, message="the fleet back")
    wait_until(lambda: sidecar_metric(stack, "loadaware_kv_events_connected") == len(ENGINES),
               message="the engines' KV-event feeds to reconnect")
    for engine in stack.fleet.engines:  # lose each engine's next KV-event batch: a gap, then a replay
        http.post_json(f"{engine['url']}/sim/kv_drop", {"batches": 1})
    for i in range(40, 60):
        complete(stack, {"model": "tiny-model", "prompt": prompt(4 + i, i), "max_tokens": 4})
    wait_until(lambda: sidecar_metric(stack, "loadaware_kv_events_gaps_total") > 0,
               message="the sidecar to see a KV-event gap")
    wait_until(lambda: sidecar_metric(stack, "loadaware_endpoint_ejections_total", endpoint=DEAD) > 0,
               message=f"{DEAD} to be ejected as unreachable")


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitored]:
    require_prometheus()
    log_dir = tmp_path_factory.mktemp("monitoring")
    endpoints_file = log_dir / "endpoints.txt"
    endpoints_file.write_text("\n".join(ENGINES) + "\n")
    objectives = log_dir / "objectives.json"
    objectives.write_text(json.dumps({"standard": {"priority": 0}, "batch": {"priority": -1}}))
    sidecar_args = ["--prefix-source", "kv-events,approx", "--scrape-interval-s", "0.2",
                    "--endpoints", "", "--endpoints-file", str(endpoints_file),
                    "--admission", "on", "--objectives", str(objectives), "--admission-ttl-s", "1"]
    with Stack(log_dir, engines=3, lmcache=False, fleet_args=["--kv-events"], sidecar_args=sidecar_args) as stack:
        assert stack.fleet is not None and stack.sidecar is not None
        assert stack.fleet.endpoints == ENGINES, "the fleet's addresses moved: update ENGINES"
        labels = {"namespace": NAMESPACE, "pool": POOL}
        config = prom.scrape_config([
            {"job": "sidecar", "targets": [stack.sidecar.metrics_listen], "labels": labels},
            {"job": "envoy", "targets": [f"127.0.0.1:{ENVOY_ADMIN_PORT}"], "labels": labels,
             "metrics_path": "/stats/prometheus"},
            {"job": "engines", "targets": ENGINES, "labels": labels}],
            rule_files=[prom.write_rules(log_dir)], interval_s=SCRAPE_S)
        with PrometheusProc(config, log_dir) as prometheus:
            started = time.monotonic()
            drive(stack, endpoints_file)
            traffic_s = time.monotonic() - started
            settled = sidecar_metric(stack, "loadaware_decisions_total")
            # Prometheus has scraped the end of the traffic, and a few more times since (rates need 2 samples).
            wait_until(lambda: _scraped_total(prometheus) >= settled, timeout=20,
                       message="Prometheus to scrape the traffic's last decisions")
            seen_at = _last_scrape(prometheus)
            wait_until(lambda: _last_scrape(prometheus) >= seen_at + 2 * SCRAPE_S, timeout=20,
                       message="Prometheus to scrape the sidecar twice more (rates need two samples of the end)")
            yield Monitored(stack, prometheus, traffic_s, endpoints_file)


def _last_scrape(prometheus: PrometheusProc) -> float:
    """When Prometheus last scraped the sidecar (its own clock, in s)."""
    result = prometheus.query('timestamp(up{job="sidecar"})')
    return float(result[0]["value"][1]) if result else 0.0


def _scraped_total(prometheus: PrometheusProc) -> float:
    result = prometheus.query('sum(loadaware_decisions_total{job="sidecar"})')
    return float(result[0]["value"][1]) if result else 0.0


# ---- the dashboard's variables, as Grafana substitutes them -----------------------------------------------

def grafana_regex(values: list[str]) -> str:
    """A multi-value variable in a Prometheus query: each value regex-escaped (backslashes doubled for the
    PromQL string), joined as an alternation, as Grafana formats it."""
    escaped = [re.sub(r"([\\.^$*+?(){}\[\]|])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def variable_values(prometheus: PrometheusProc, dashboard: dict[str, Any]) -> dict[str, str]:
    """Each query variable's values from its own `label_values(selector, label)`, in the dashboard's order
    (a later variable's selector uses the earlier ones)."""
    chosen: dict[str, str] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.*), *(\w+)\)", variable["query"])
        assert match, variable["query"]
        selector, label = substitute(match.group(1), chosen), match.group(2)
        values = prometheus.label_values(label, selector)
        assert values, f"variable {variable['name']}: {variable['query']} lists nothing"
        chosen[variable["name"]] = grafana_regex(sorted(values))
    return chosen


def substitute(expr: str, chosen: dict[str, str]) -> str:
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name, value in chosen.items():
        expr = expr.replace(f"${name}", value)
    return expr


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


# ---- tests -------------------------------------------------------------------------------------------------

def test_dashboard_json_is_generated_from_its_code() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, str(REPO / "k8s" / "monitoring" / "dashboard.py"), "--check"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_every_target_is_up(monitored: Monitored) -> None:
    health = monitored.prometheus.targets_up()
    assert len(health) == 2 + len(ENGINES) and set(health.values()) == {"up"}, health


def test_variables_list_the_stack(monitored: Monitored) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    chosen = variable_values(monitored.prometheus, dashboard)
    assert chosen["namespace"] == NAMESPACE and chosen["pool"] == POOL
    listed = monitored.prometheus.label_values("endpoint", 'loadaware_endpoint_routing_state{pool="test-pool"}')
    assert sorted(listed) == sorted([*ENGINES, DEAD])


def test_every_panel_query_returns_series(monitored: Monitored) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    chosen = variable_values(monitored.prometheus, dashboard)
    queries = panel_queries(dashboard)
    empty = [(title, expr) for title, expr in queries if not monitored.prometheus.query(substitute(expr, chosen))]
    print(f"{len(queries)} panel queries in {len(dashboard['panels'])} panels; {len(empty)} empty")
    assert not empty, "panel queries with no series:\n" + "\n".join(f"{t}: {e}" for t, e in empty)
    assert len(queries) >= 20


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in prom.plain_rules()["groups"] for r in g["rules"] if "alert" in r]


# Counters that exist only after their event, which this stack cannot cause: static discovery never fails.
# They must still be exported (a HELP/TYPE line Prometheus keeps as metadata), so a rename still fails here.
NO_EVENT_IN_THIS_STACK = {"loadaware_discovery_errors_total"}


def test_every_alert_expression_evaluates_and_its_metrics_have_series(monitored: Monitored) -> None:
    prometheus = monitored.prometheus
    rules = alert_rules()
    missing: list[str] = []
    selectors = 0
    for rule in rules:
        prometheus.query(rule["expr"])  # raises with Prometheus's error on a bad expression
        for name, matchers in SELECTOR.findall(rule["expr"]):
            selectors += 1
            if name in NO_EVENT_IN_THIS_STACK:
                if not prometheus.api("metadata", metric=name):
                    missing.append(f"{rule['alert']}: {name} is not exported at all")
            elif not prometheus.query(f"count({name}{matchers})"):
                missing.append(f"{rule['alert']}: {name}{matchers}")
    print(f"{len(rules)} alert expressions, {selectors} selectors checked")
    assert not missing, "\n".join(missing)


def test_prometheus_evaluates_every_rule_without_error(monitored: Monitored) -> None:
    def evaluated() -> list[dict[str, Any]] | None:
        rules = [r for g in monitored.prometheus.api("rules")["groups"] for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules) else None

    rules = wait_until(evaluated, message="Prometheus to evaluate every rule once")
    assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()}
    assert [r for r in rules if r["health"] != "ok"] == []


def test_alert_rules_pass_promtool(tmp_path: Path) -> None:
    require_prometheus()
    rules = prom.write_rules(tmp_path)
    shutil.copy(prom.ALERT_TESTS, tmp_path / prom.ALERT_TESTS.name)
    checked = prom.promtool("check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = prom.promtool("test", "rules", prom.ALERT_TESTS.name, cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert has a case where it fires and one where it stays quiet.
    cases = [case for test in yaml.safe_load(prom.ALERT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    for rule in alert_rules():
        outcomes = {bool(c["exp_alerts"]) for c in cases if c["alertname"] == rule["alert"]}
        assert outcomes == {True, False}, f"{rule['alert']}: needs a firing and a quiet case"
    print(f"{len(cases)} promtool alert cases over {len(alert_rules())} alerts")


NO_SAMPLE = "(no sample in this stack)"


def exported_families(text: str) -> list[str]:
    """`name type label,label` per family of a /metrics text: the labels seen on its samples (`le` aside;
    `-` for none), or NO_SAMPLE. prometheus_client's `_created` companions are left out."""
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if not name.endswith("_created"):
                types[name] = kind
    labels: dict[str, set[str]] = {}
    for sample in samples(text):
        family = next((f for f in (sample.name, *(sample.name.removesuffix(s) for s in
                      ("_bucket", "_sum", "_count"))) if f in types), None)
        if family is not None:
            labels.setdefault(family, set()).update(set(sample.labels) - {"le"})
    return [f"{name} {types[name]} " + (NO_SAMPLE if name not in labels else ",".join(sorted(labels[name])) or "-")
            for name in sorted(types)]


def test_exported_metrics_match_the_golden_list(monitored: Monitored) -> None:
    """A rename, a new family or a changed label set is a deliberate change: regenerate the golden list
    with UPDATE_GOLDEN=1 and review its diff."""
    assert monitored.stack.sidecar is not None
    live = exported_families(monitored.stack.sidecar.metrics_text())
    import os

    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text("# name type labels (tests/e2e/test_monitoring.py; UPDATE_GOLDEN=1 rewrites)\n"
                          + "\n".join(live) + "\n")
    golden = [line for line in GOLDEN.read_text().splitlines() if line and not line.startswith("#")]
    assert live == golden


def test_a_feed_that_never_connects_shows_disconnected(monitored: Monitored) -> None:
    connected = {s.labels["endpoint"]: s.value for s in samples(monitored.stack.sidecar.metrics_text())
                 if s.name == "loadaware_kv_events_connected"} if monitored.stack.sidecar else {}
    assert connected == {**dict.fromkeys(ENGINES, 1.0), DEAD: 0.0}
    assert monitored.prometheus.query(f'loadaware_kv_events_connected{{endpoint="{DEAD}"}} == 0')


def test_epp_families_agree_with_the_native_metrics(monitored: Monitored) -> None:
    stack = monitored.stack
    assert stack.sidecar is not None
    wait_until(lambda: sidecar_metric(stack, "loadaware_inflight_requests") == 0, message="requests to end")
    text = stack.sidecar.metrics_text()  # one render: every figure below is of the same moment

    def one(family: str, **labels: str) -> float:
        return metric_sum(text, family, labels)

    def per_endpoint(name: str) -> dict[str, float]:
        return {s.labels["endpoint"]: s.value for s in samples(text) if s.name == name}

    # Every decision, fleet-wide: the per-endpoint `loadaware_decisions_total` series leave with their endpoint
    # (this stack empties its fleet once), the decision-time histogram counts them all.
    decided = one("loadaware_decision_seconds_count")
    assert one("inference_objective_request_total") == decided > 40
    assert one("inference_objective_request_duration_seconds_count") == decided
    assert one("inference_objective_request_error_total", error_code="BadRequest") == \
        one("loadaware_decisions_total", outcome="unknown_model") == 1
    assert one("inference_objective_request_total", model_name="tiny-model") >= 40
    assert one("inference_pool_ready_pods", name="default") == one("loadaware_endpoints") == len(ENGINES) + 1
    waiting, running, kv = (per_endpoint(n) for n in ("loadaware_engine_waiting", "loadaware_engine_running",
                                                      "loadaware_engine_kv_cache_usage"))
    assert set(waiting) == set(ENGINES)  # the dead address was never scraped
    assert one("inference_pool_average_queue_size") == pytest.approx(sum(waiting.values()) / len(waiting))
    assert one("inference_pool_average_queue_size") == pytest.approx(2.0)  # phantom 3 + 3 + 0 queued
    assert one("inference_pool_average_running_requests") == pytest.approx(sum(running.values()) / len(running))
    assert one("inference_pool_average_kv_cache_utilization") == pytest.approx(sum(kv.values()) / len(kv))
    per_pod = {s.labels["model_server_pod"]: s.value for s in samples(text)
               if s.name == "inference_pool_per_pod_queue_size"}
    assert per_pod == waiting
    native = {s.labels["le"]: s.value for s in samples(text) if s.name == "loadaware_decision_seconds_bucket"}
    epp = {s.labels["le"]: s.value for s in samples(text)
           if s.name == "inference_extension_scheduler_e2e_duration_seconds_bucket"}
    assert epp == native and native["+Inf"] == one("loadaware_decision_seconds_count") > 0
