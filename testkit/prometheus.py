"""A real Prometheus (Debian's `prometheus` package, with `promtool`) as a managed process, and its HTTP API.

Run on 127.0.0.1 with a config and a storage directory of the caller's, never as the package's service.
`make test` installs the package (the Makefile's `prometheus` prerequisite); a test that needs it fails
under CI=true when the binary is missing (`require_prometheus`), and skips elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from testkit import http
from testkit.paths import REPO
from testkit.ports import free_port
from testkit.procs import ManagedProc, ProcError

PROMETHEUS = "prometheus"
PROMTOOL = "promtool"
RULES_SOURCE = REPO / "k8s" / "base" / "prometheusrule.yaml"
ALERT_TESTS = REPO / "k8s" / "monitoring" / "alerts-test.yml"  # .yml: not a manifest (k8s/**/*.yaml are)
RULES_FILE_NAME = "loadaware-rules.yaml"  # the name alerts-test.yaml loads, beside it


def binary(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/bin/{name}",) if os.access(p, os.X_OK)), None)


def missing() -> str | None:
    """Why the real Prometheus cannot run here (None: it can)."""
    for name in (PROMETHEUS, PROMTOOL):
        if binary(name) is None:
            return f"{name} not installed (Debian package `prometheus`: `make prometheus`)"
    return None


def require_prometheus() -> None:
    """Skip without the binaries, except under CI=true, where their absence is a failure (testkit/require.py)."""
    from testkit.require import require

    reason = missing()
    require("Prometheus", reason is None, reason or "")


def plain_rules(source: Path = RULES_SOURCE) -> dict[str, Any]:
    """The PrometheusRule's `spec` (its rule groups): the rules file Prometheus and promtool read."""
    spec = yaml.safe_load(source.read_text())["spec"]
    return {"groups": spec["groups"]}


def write_rules(directory: Path) -> Path:
    path = directory / RULES_FILE_NAME
    path.write_text(yaml.safe_dump(plain_rules(), sort_keys=False))
    return path


def scrape_config(targets: Sequence[Mapping[str, Any]], rule_files: Sequence[Path] = (),
                  interval_s: float = 1.0) -> dict[str, Any]:
    """`targets`: {"job", "targets": [host:port], "labels": {...}, optional "metrics_path"}."""
    jobs = []
    for t in targets:
        job: dict[str, Any] = {"job_name": t["job"], "static_configs": [{"targets": list(t["targets"]),
                                                                        "labels": dict(t.get("labels", {}))}]}
        if "metrics_path" in t:
            job["metrics_path"] = t["metrics_path"]
        jobs.append(job)
    interval = f"{int(interval_s * 1000)}ms"
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(p) for p in rule_files], "scrape_configs": jobs}


class PrometheusProc(ManagedProc):
    """Ready when /-/ready answers 200; the TSDB lives under `log_dir` and is thrown away with it."""

    name = "prometheus"

    def __init__(self, config: Mapping[str, Any], log_dir: str | os.PathLike[str], port: int | None = None) -> None:
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = log_dir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        storage = log_dir / "prometheus-data"
        shutil.rmtree(storage, ignore_errors=True)
        exe = binary(PROMETHEUS)
        if exe is None:
            raise ProcError(missing() or "prometheus missing")
        super().__init__([exe, f"--config.file={self.config_path}", f"--storage.tsdb.path={storage}",
                          f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=2h",
                          "--log.level=warn"], log_dir)

    def _is_ready(self) -> bool:
        status, _ = http.request("GET", f"{self.url}/-/ready", timeout=0.5)
        return status == 200

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the `data` of a successful answer, else a ProcError with Prometheus's error."""
        query = urllib.parse.urlencode(params)
        status, body = http.request("GET", f"{self.url}/api/v1/{path}" + (f"?{query}" if query else ""), timeout=10)
        answer = json.loads(body) if body else {}
        if status != 200 or answer.get("status") != "success":
            raise ProcError(f"prometheus {path} {params} -> HTTP {status}: {body[:300]!r}")
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (a scalar or a string comes back as one pseudo-series)."""
        data = self.api("query", query=expr)
        result = data["result"]
        return list(result) if data["resultType"] in ("vector", "matrix") else [{"metric": {}, "value": result}]

    def label_values(self, label: str, match: str) -> list[str]:
        return list(self.api(f"label/{label}/values", **{"match[]": match}))

    def targets_up(self) -> dict[str, str]:
        """scrape URL -> health (up / down / unknown) of every active target."""
        return {t["scrapeUrl"]: t["health"] for t in self.api("targets")["activeTargets"]}


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    exe = binary(PROMTOOL)
    if exe is None:
        raise ProcError(missing() or "promtool missing")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False)
