"""Where things are in a checkout: the repository root, its virtual environments, shipped configs."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
# LMCache pins clash with ours (grpcio, protobuf, prometheus_client, numpy): it has its own environment.
# TESTKIT_LMCACHE_VENV points elsewhere (tests/unit/test_require.py points it at nothing).
LMCACHE_VENV_BIN = Path(os.environ.get("TESTKIT_LMCACHE_VENV") or REPO / ".lmcache-venv") / "bin"
ENVOY_CONFIG = REPO / "envoy" / "envoy.yaml"
ENVOY_PASSTHROUGH_CONFIG = REPO / "envoy" / "envoy-passthrough.yaml"
TINY_TOKENIZER = REPO / "sim" / "assets" / "tiny-model"
DEFAULT_LOG_DIR = REPO / "out" / "logs"  # /out/ is git-ignored


def venv_tool(name: str) -> str:
    """Prefer the project's venv so tests behave the same whichever interpreter launched them."""
    for candidate in (VENV_BIN / name, Path(sys.executable).parent / name):
        if candidate.exists():
            return str(candidate)
    return name


def python() -> str:
    py = VENV_BIN / "python"
    return str(py) if py.exists() else sys.executable


def repo_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this environment) with the repository root first on PYTHONPATH: sim, testkit,
    experiment and bench are not installed, so `python -m sim.fleet` must find them from any cwd."""
    env = dict(os.environ if base is None else base)
    rest = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + rest if rest else "")
    return env
