"""Every piece of the sidecar fits on a screen: no function in loadaware/ is longer than 60 lines, no class than
300, and no constructor outside the composition root (loadaware/app.py) takes more than 6 arguments. A record
(a dataclass's generated constructor: Settings, CoreOptions, DecisionContext, Candidate, ...) is data, not a
component that reaches into others, and is not counted."""

from __future__ import annotations

import ast
from pathlib import Path

from testkit.paths import REPO

PACKAGE = REPO / "loadaware"
COMPOSITION_ROOT = PACKAGE / "app.py"
MAX_FUNCTION_LINES, MAX_CLASS_LINES, MAX_CONSTRUCTOR_ARGS = 60, 300, 6


def findings(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        where = f"{path.name}:{node.lineno}"
        if isinstance(node, ast.ClassDef) and lines > MAX_CLASS_LINES:
            out.append(f"{where} class {node.name}: {lines} lines")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if lines > MAX_FUNCTION_LINES:
                out.append(f"{where} {node.name}: {lines} lines")
            args = len(node.args.posonlyargs) + len(node.args.args) + len(node.args.kwonlyargs) - 1
            if node.name == "__init__" and args > MAX_CONSTRUCTOR_ARGS and path != COMPOSITION_ROOT:
                out.append(f"{where} __init__: {args} arguments")
    return out


def test_every_function_class_and_constructor_fits() -> None:
    found = [f"{path.parent.relative_to(REPO)}/{f}" for path in sorted(PACKAGE.rglob("*.py"))
             if "_pb2" not in path.name for f in findings(path)]
    assert not found, "\n".join(found)


def test_the_check_can_fail(tmp_path: Path) -> None:
    long = "def f():\n" + "    x = 1\n" * 61
    wide = "class A:\n    def __init__(self, a, b, c, d, e, f, g):\n        pass\n"
    sample = tmp_path / "sample.py"
    sample.write_text(long + wide)
    assert [f.split(" ", 1)[1] for f in findings(sample)] == ["f: 62 lines", "__init__: 7 arguments"]
