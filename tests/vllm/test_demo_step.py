"""The demo's real-vLLM step (demo/real_vllm.py, part of `make demo` when the vLLM venv exists), walked on the
tier's engines: every check it prints holds."""

from __future__ import annotations

from pathlib import Path

from demo.real_vllm import run_real_vllm_step
from testkit.vllm import VllmEngine
from tests.vllm.conftest import LOG_DIR


def test_demo_step_passes_its_checks(pair: tuple[VllmEngine, VllmEngine]) -> None:
    checks: list[tuple[bool, str]] = []

    def check(ok: bool, what: str) -> bool:
        checks.append((ok, what))
        return ok

    assert run_real_vllm_step(Path(LOG_DIR) / "demo", 1.0, check, engines=pair) == "ok"
    assert len(checks) >= 5
    assert [what for ok, what in checks if not ok] == []
