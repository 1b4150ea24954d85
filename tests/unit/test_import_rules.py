"""The import-layer contracts in pyproject.toml hold, and they break when an import runs the wrong way."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The packages the contracts name (pyproject.toml's root_packages): a copy of the tree holds every one of them.
PACKAGES = tuple(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"])
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages and pyproject.toml, copied, so a test can plant a bad import without touching the tree."""
    root = tmp_path_factory.mktemp("tree")
    for name in PACKAGES:
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def plant(root: Path, module: str, line: str) -> str:
    path = root / module
    original = path.read_text()
    path.write_text(original + f"\n{line}\n")
    return original


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("loadaware/policies/base.py", "import loadaware.routing.pipeline", "Inside the sidecar"),
    ("loadaware/policies/base.py", "import time", "Policies are pure"),
    ("loadaware/prefix/approx.py", "import loadaware.config", "Inside the sidecar"),
    ("loadaware/load/tracker.py", "import loadaware.prefix.blocks", "Inside the sidecar"),  # siblings: independent
    ("loadaware/extproc/stream.py", "import loadaware.load.tracker", "The ext_proc server"),
    ("sim/engine.py", "import testkit", "Projects run one way"),
    ("loadaware/app.py", "import sim", "Projects run one way"),
])
def test_a_wrong_way_import_breaks_a_contract(tree_copy: Path, module: str, line: str, contract: str) -> None:
    original = plant(tree_copy, module, line)
    try:
        result = lint_imports(tree_copy)
    finally:
        (tree_copy / module).write_text(original)
    assert result.returncode != 0, result.stdout
    # lint-imports wraps a long contract name over lines: the broken ones are listed by name after this header
    assert "Broken contracts" in result.stdout, result.stdout
    broken = result.stdout.split("Broken contracts", 1)[1]
    assert any(ln.startswith(contract) for ln in broken.splitlines()), result.stdout


def test_the_tree_keeps_every_contract(tree_copy: Path) -> None:
    result = lint_imports(tree_copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
