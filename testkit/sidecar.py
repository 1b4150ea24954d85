"""The loadaware sidecar (`loadaware-sidecar serve <args>`) as a managed process."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence

from testkit import http
from testkit.paths import DEFAULT_LOG_DIR, VENV_BIN, python
from testkit.ports import SIDECAR_PORT, accepts, split_hostport
from testkit.procs import ManagedProc, ProcError

DEFAULT_METRICS_LISTEN = "127.0.0.1:9102"  # the sidecar's own default for --metrics-listen


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
    """Ready when grpc.health.v1 says SERVING (without a health client: when its port accepts)."""

    name = "sidecar"

    def __init__(self, args: Sequence[str], env: Mapping[str, str] | None = None,
                 log_dir: str | os.PathLike[str] = DEFAULT_LOG_DIR) -> None:
        self.args = [str(a) for a in args]
        full_env = dict(os.environ)
        full_env.update(env or {})
        # Same precedence as the sidecar's own settings: flag > environment > default.
        self.listen = (flag_value(self.args, "--listen") or full_env.get("LOADAWARE_LISTEN")
                       or f"127.0.0.1:{SIDECAR_PORT}")
        self.metrics_listen = (flag_value(self.args, "--metrics-listen")
                               or full_env.get("LOADAWARE_METRICS_LISTEN") or DEFAULT_METRICS_LISTEN)
        super().__init__([*self.command(), "serve", *self.args], log_dir, env=full_env)

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
        with grpc.insecure_channel(f"{host}:{port}") as channel:
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
        host, port = split_hostport(self.metrics_listen)
        status, body = http.request("GET", f"http://{host}:{port}/metrics", timeout=timeout)
        if status != 200:
            raise ProcError(f"sidecar /metrics -> HTTP {status}")
        return body.decode()
