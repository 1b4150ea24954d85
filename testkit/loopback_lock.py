"""One machine-wide lock around everything that binds the shipped fixed loopback addresses."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from testkit.procs import ProcError

# Machine-wide, not per TMPDIR: the addresses it guards are shared by every checkout and every TMPDIR on
# this host (a run under another TMPDIR once started a second stack beside a running experiment).
LOOPBACK_LOCK_PATH = Path(os.environ.get("LOADAWARE_LOOPBACK_LOCK", "/tmp/loadaware-loopback.lock"))

_guard = threading.Lock()
_depth = 0
_file: IO[str] | None = None


@contextlib.contextmanager
def loopback_lock(timeout: float = 300.0) -> Iterator[None]:
    """Serialize, across processes, everything that binds the shipped fixed addresses (Envoy :10000/:9901,
    sidecar :9002, engines 127.0.0.2-4:8000): two test runs at once would otherwise steal each other's
    ports and fail confusingly. Reentrant within a process, so a test holding it can start a Stack."""
    global _depth, _file
    with _guard:
        if _depth == 0:
            f = open(LOOPBACK_LOCK_PATH, "a+")  # noqa: SIM115 - held open for as long as the lock is held
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        f.close()
                        raise ProcError(
                            f"{LOOPBACK_LOCK_PATH} still held after {timeout:.1f}s by another run") from None
                    time.sleep(0.1)
            _file = f
        _depth += 1
    try:
        yield
    finally:
        with _guard:
            _depth -= 1
            if _depth == 0 and _file is not None:
                fcntl.flock(_file, fcntl.LOCK_UN)
                _file.close()
                _file = None
