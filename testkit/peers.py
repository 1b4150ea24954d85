"""The peer routers (sglang-router, vllm-router: the cache-aware routers the sidecar is compared with) as
managed processes, from their own virtual environment. Used by the experiment (experiment/realtime) and by
the benchmark's table (bench/table.py), which is why it lives here and not in either.

    make peers   # .peers-venv: sglang-router==0.3.2, vllm-router==0.1.17 (Rust routers, PyPI wheels)

Both run `--policy cache_aware` with their default thresholds (cache 0.3, balance abs 64 / rel 1.5), in
front of the same simulated engines, bound to 127.0.0.1 on a free port. Two things are set beyond the
policy, neither of which touches routing: the Prometheus exporter goes to a free loopback port (both
default to the same port and the second one would panic), and logs are quiet (each request would
otherwise log a line, costing CPU that the simulated engines need on this 2-core machine).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from testkit import http
from testkit.paths import REPO
from testkit.ports import free_port
from testkit.procs import ManagedProc, ProcError

PEERS_VENV_BIN = Path(os.environ.get("EXPERIMENT_PEERS_BIN", REPO / ".peers-venv" / "bin"))
PEER_VERSIONS = {"sglang-router": "0.3.2", "vllm-router": "0.1.17"}


def peers_available() -> bool:
    return all((PEERS_VENV_BIN / name).exists() for name in PEER_VERSIONS)


class PeerProc(ManagedProc):
    """One peer router; ready when its /health answers 200 (it checks the workers before that)."""

    ready_timeout = 60.0
    stop_grace = 3.0

    def __init__(self, peer: str, worker_urls: Sequence[str], log_dir: str | os.PathLike[str],
                 policy: str = "cache_aware", port: int | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        if peer not in PEER_VERSIONS:
            raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEER_VERSIONS)}")
        self.name = peer
        self.peer = peer
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        prom = free_port()
        binary = PEERS_VENV_BIN / peer
        argv: list[str] = [str(binary)]
        if peer == "sglang-router":
            argv += ["launch"]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--policy", policy,
                 "--worker-urls", *worker_urls, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom)]
        if peer == "sglang-router":
            argv += ["--log-level", "warn", "--shutdown-grace-period-secs", "1"]
        else:
            argv += ["--log-level", "warning"]
        argv += list(extra_args)
        super().__init__(argv, log_dir, env={**os.environ, "RUST_LOG": "warn", "NO_COLOR": "1"})

    def _before_start(self) -> None:
        if not (PEERS_VENV_BIN / self.peer).exists():
            raise ProcError(f"{self.peer} not installed in {PEERS_VENV_BIN}; run `make peers`")

    def _is_ready(self) -> bool:
        status, _ = http.request("GET", f"{self.url}/health", timeout=1.0)
        return status == 200
