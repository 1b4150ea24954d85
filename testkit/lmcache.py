"""The real LMCache controller (from `.lmcache-venv`) on free loopback ports, and a small client of it.

Its pins clash with ours (grpcio, protobuf, prometheus_client, numpy), so it runs from its own environment.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from loadaware.fleet.addresses import format_hostport, http_url
from sim.lmcache_reporter import ControllerAddress
from testkit import http
from testkit.paths import LMCACHE_VENV_BIN
from testkit.ports import free_ports
from testkit.procs import ManagedProc, ProcError

CONTROLLER_BINARY = LMCACHE_VENV_BIN / "lmcache_controller"


class LMCacheControllerProc(ManagedProc):
    """Ready when `/lookup` answers (3-8 s measured; the torch import can be much slower on a loaded box)."""

    name = "lmcache-controller"
    ready_timeout = 60.0

    def __init__(self, log_dir: str | os.PathLike[str], host: str = "127.0.0.1", port: int | None = None,
                 pull: int | None = None, reply: int | None = None, heartbeat: int | None = None) -> None:
        self.host = host
        spare = iter(free_ports(4, host))
        self.port = port or next(spare)
        self.pull_port = pull or next(spare)
        self.reply_port = reply or next(spare)
        self.heartbeat_port = heartbeat or next(spare)
        self.url = http_url(format_hostport(host, self.port))
        monitor = json.dumps({"pull": self.pull_port, "reply": self.reply_port,
                              "heartbeat": self.heartbeat_port})
        # --host must always be passed: it defaults to 0.0.0.0 for HTTP and every ZMQ socket.
        argv = [str(CONTROLLER_BINARY), "--host", host, "--port", str(self.port), "--monitor-ports", monitor]
        # A fixed hash seed keeps the controller's own runs reproducible (chunk keys hash ints: seed-free).
        super().__init__(argv, log_dir, env={**os.environ, "PYTHONHASHSEED": "0"})

    @classmethod
    def available(cls) -> bool:
        return CONTROLLER_BINARY.exists()

    @property
    def address(self) -> ControllerAddress:
        """Where a simulated engine reports to (its LMCache worker's ZMQ sockets)."""
        return ControllerAddress(self.host, self.pull_port, self.reply_port)

    def post(self, path: str, body: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        return dict(http.post_json(self.url + path, body, timeout=timeout))

    def lookup(self, tokens: list[int]) -> dict[str, list[Any]]:
        """Instance id -> [backend, tokens credited] for the prefix of `tokens`, as the sidecar sees it."""
        return dict(self.post("/lookup", {"tokens": tokens})["layout_info"])

    def _before_start(self) -> None:
        if not self.available():
            raise ProcError(f"LMCache venv missing ({LMCACHE_VENV_BIN}); run `make lmcache`")

    def _is_ready(self) -> bool:
        status, _ = http.request("POST", f"{self.url}/lookup", json.dumps({"tokens": [1]}).encode(), timeout=1.0)
        return status == 200


def start_controller(log_dir: Path | None = None) -> LMCacheControllerProc:
    """A started controller; its log goes to a fresh temporary directory unless `log_dir` is given."""
    return LMCacheControllerProc(log_dir or Path(tempfile.mkdtemp(prefix="lmcache-controller-"))).start()
