"""The loadaware sidecar (`loadaware-sidecar serve <args>`) as a managed process."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from loadaware.fleet.addresses import format_hostport, http_url
from testkit import http
from testkit.paths import DEFAULT_LOG_DIR, VENV_BIN, python
from testkit.ports import SIDECAR_PORT, accepts, free_port, split_hostport
from testkit.procs import ManagedProc, ProcError

DEFAULT_METRICS_LISTEN = "127.0.0.1:9102"  # the sidecar's own default for --metrics-listen
OFF = ("", "off", "none")


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """Last value of `flag` (argparse semantics: a later occurrence wins)."""
    value: str | None = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1 :]
    return value


class SidecarProc(ManagedProc):
    """Ready when grpc.health.v1 says SERVING (without a health client: when its port accepts).

    The admin listeners (--admin-listen: the loadaware.v1 debug API and reflection; --admin-http-listen:
    /debug/*) get free loopback ports unless the flag or its variable names one: the sidecar's fixed defaults
    (127.0.0.1:9004, :9005) would collide between runs sharing this machine.
    """

    name = "sidecar"

    def __init__(self, args: Sequence[str], env: Mapping[str, str] | None = None,
                 log_dir: str | os.PathLike[str] = DEFAULT_LOG_DIR, command: Sequence[str] | None = None) -> None:
        self.args = [str(a) for a in args]
        full_env = dict(os.environ)
        full_env.update(env or {})
        # Same precedence as the sidecar's own settings: flag > environment > default.
        self.listen = (flag_value(self.args, "--listen") or full_env.get("LOADAWARE_LISTEN")
                       or f"127.0.0.1:{SIDECAR_PORT}")
        self.metrics_listen = (flag_value(self.args, "--metrics-listen")
                               or full_env.get("LOADAWARE_METRICS_LISTEN") or DEFAULT_METRICS_LISTEN)
        self.admin_listen = self._admin_address("--admin-listen", "LOADAWARE_ADMIN_LISTEN", full_env)
        self.admin_http_listen = self._admin_address("--admin-http-listen", "LOADAWARE_ADMIN_HTTP_LISTEN", full_env)
        # `command`: the program in the sidecar's place, e.g. a profiler running it (testkit/profiled.py)
        super().__init__([*(command or self.command()), "serve", *self.args], log_dir, env=full_env)

    def _admin_address(self, flag: str, env: str, full_env: Mapping[str, str]) -> str:
        """The address the sidecar will use ('' when off); a free loopback port when nothing names one."""
        given = flag_value(self.args, flag)
        if given is None and full_env.get(env, "").strip():
            given = full_env[env]
        if given is None:
            given = f"127.0.0.1:{free_port()}"
            self.args += [flag, given]
        return "" if given.strip().lower() in OFF else given.strip()

    @property
    def debug_url(self) -> str:
        """http://HOST:PORT of /debug/decisions and /debug/state (the admin HTTP listener)."""
        if not self.admin_http_listen:
            raise ProcError("sidecar --admin-http-listen is off")
        return http_url(format_hostport(*split_hostport(self.admin_http_listen)))

    def debug_json(self, path: str, timeout: float = 5.0) -> Any:
        """GET a /debug page (`path` like "/debug/state") and parse it."""
        status, body = http.request("GET", self.debug_url + path, timeout=timeout)
        if status != 200:
            raise ProcError(f"sidecar {path} -> HTTP {status}")
        return json.loads(body)

    @staticmethod
    def command() -> list[str]:
        """The console script when installed; else the same entry point (loadaware.cli:main) via python, so a
        checkout whose venv predates the script still runs."""
        script = VENV_BIN / "loadaware-sidecar"
        if script.exists():
            return [str(script)]
        return [python(), "-c", "import sys; from loadaware.cli import main; sys.exit(main())"]

    @classmethod
    def available(cls) -> bool:
        # The package installed without the console script still runs through `command()`.
        return (VENV_BIN / "loadaware-sidecar").exists() or importlib.util.find_spec("loadaware") is not None

    def _is_ready(self) -> bool:
        host, port = split_hostport(self.listen)
        if not accepts(host, port):
            return False
        try:
            import grpc
            from grpc_health.v1 import health_pb2, health_pb2_grpc
        except ImportError:
            return True  # no health client available: an accepting port is the best signal we have
        with grpc.insecure_channel(format_hostport(host, port)) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=0.5)
            except grpc.RpcError as e:
                # A server without the health service is up as far as we can tell.
                return e.code() == grpc.StatusCode.UNIMPLEMENTED
            return resp.status == health_pb2.HealthCheckResponse.SERVING

    def metrics_text(self, timeout: float = 2.0) -> str:
        if not self.metrics_listen:
            raise ProcError("sidecar metrics endpoint disabled")
        url = http_url(format_hostport(*split_hostport(self.metrics_listen)), "/metrics")
        status, body = http.request("GET", url, timeout=timeout)
        if status != 200:
            raise ProcError(f"sidecar /metrics -> HTTP {status}")
        return body.decode()
