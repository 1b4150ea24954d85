"""One subprocess in its own process group, with a readiness probe, a bounded stop and its log.

Every process runs in its own session (process group), so stopping it also stops anything it spawned; logs
go to one file per process under a caller-given directory, and a process that fails to become ready is
reported with the tail of its log, because "timed out" alone is useless when debugging CI.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from testkit.paths import REPO


class ProcError(RuntimeError):
    """A managed process died or did not become ready; the message carries its log tail."""


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` from /proc (user+system CPU, what the benchmarks compare)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read().decode()
    # The command name (field 2) may contain spaces or parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5), 1-based
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


class ManagedProc:
    """Subclasses set `name` and implement `_is_ready`; `start()` returns once it is ready (or raises)."""

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
        return cpu_seconds(self.pid)

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
