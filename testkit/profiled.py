"""The sidecar run under memray, a profiler that records every allocation and free with its native stack.

memray is not a dependency of the project (`pip install memray`, or a `--target` folder on PYTHONPATH); the
probes that use it (`python -m research.probes.sidecar_stream_leak --memray FILE`, `python -m bench.soak
--memray-dir DIR`) say so and stop when it is missing. `python -m research.probes.memray_run FILE` reads a capture.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from testkit.paths import python


def memray_available() -> bool:
    return importlib.util.find_spec("memray") is not None


def memray_sidecar(out: Path) -> list[str]:
    """The sidecar (loadaware.cli) under memray with native stacks, recording to `out`: SidecarProc's
    `command`. Stops when memray cannot be imported, rather than start a sidecar nothing records."""
    if not memray_available():
        raise SystemExit("needs memray: pip install memray (into the venv, or a --target folder on PYTHONPATH)")
    out.parent.mkdir(parents=True, exist_ok=True)
    return [python(), "-m", "memray", "run", "--native", "-q", "-f", "-o", str(out), "-m", "loadaware.cli"]
