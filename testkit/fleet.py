"""`python -m sim.fleet` (N simulated engines, one loopback ip each) as a managed process."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from loadaware.fleet.addresses import format_hostport
from testkit.lmcache import LMCacheControllerProc
from testkit.paths import REPO, TINY_TOKENIZER, python, repo_env
from testkit.procs import ManagedProc


class FleetProc(ManagedProc):
    """Ready on its `READY [...]` line, which lists the engines (name, ip, port, url, ...)."""

    name = "fleet"

    def __init__(self, log_dir: str | os.PathLike[str], engines: int = 3, base_ip: str = "127.0.0.2",
                 port: int = 8000, tokenizer: str | os.PathLike[str] = TINY_TOKENIZER,
                 lmcache: LMCacheControllerProc | None = None, extra_args: Sequence[str] = ()) -> None:
        argv = [python(), "-u", "-m", "sim.fleet", "--engines", str(engines), "--base-ip", base_ip,
                "--port", str(port), "--tokenizer", str(tokenizer)]
        if lmcache is not None:
            argv += ["--lmcache-host", lmcache.host, "--lmcache-pull-port", str(lmcache.pull_port),
                     "--lmcache-reply-port", str(lmcache.reply_port)]
        argv += list(extra_args)
        self.engines: list[dict[str, Any]] = []
        super().__init__(argv, log_dir, env=repo_env(), cwd=REPO)

    @classmethod
    def available(cls) -> bool:
        return (REPO / "sim" / "fleet.py").exists()

    @property
    def endpoints(self) -> list[str]:
        return [format_hostport(e["ip"], e["port"]) for e in self.engines]  # IPv6 bracketed

    def _is_ready(self) -> bool:
        # stdout shares the log file; the READY line carries the engine list as JSON.
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("READY "):
                self.engines = list(json.loads(line[len("READY "):]))
                return True
        return False
