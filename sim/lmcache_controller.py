"""Start and stop a real LMCache controller (from the separate `.lmcache-venv`) on free loopback ports.

Used by the integration tests; the controller takes 3-8 s to come up, so readiness is polled via /lookup.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sim.lmcache_reporter import ControllerAddress

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BINARY = REPO_ROOT / ".lmcache-venv" / "bin" / "lmcache_controller"


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class ControllerProcess:
    proc: subprocess.Popen[bytes]
    host: str
    http_port: int
    pull_port: int
    reply_port: int
    heartbeat_port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def address(self) -> ControllerAddress:
        return ControllerAddress(self.host, self.pull_port, self.reply_port)

    def post(self, path: str, body: dict[str, object], timeout: float = 5.0) -> dict[str, object]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def lookup(self, tokens: list[int]) -> dict[str, list[object]]:
        return self.post("/lookup", {"tokens": tokens})["layout_info"]  # type: ignore[return-value]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_controller(binary: Path = DEFAULT_BINARY, host: str = "127.0.0.1", log_dir: Path | None = None,
                     ready_timeout_s: float = 40.0) -> ControllerProcess:
    if not binary.exists():
        raise FileNotFoundError(binary)
    http_port, pull, reply, heartbeat = free_ports(4, host)
    log_path = (log_dir or Path("/tmp")) / f"lmcache-controller-{http_port}.log"
    log_file = open(log_path, "wb")
    proc = subprocess.Popen(
        [str(binary), "--host", host, "--port", str(http_port),
         "--monitor-ports", json.dumps({"pull": pull, "reply": reply, "heartbeat": heartbeat})],
        stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    log_file.close()
    ctl = ControllerProcess(proc, host, http_port, pull, reply, heartbeat, log_path)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"lmcache_controller exited {proc.returncode}; see {log_path}")
        try:
            ctl.lookup([1, 2, 3])
            return ctl
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.2)
    ctl.stop()
    raise TimeoutError(f"lmcache_controller not ready in {ready_timeout_s}s; see {log_path}")
