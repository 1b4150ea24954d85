"""docs/architecture.md's layer diagram, rendered from the import-linter contracts in pyproject.toml.

    python -m testkit.layers_doc            # print the diagram (the marked region)
    python -m testkit.layers_doc --write    # rewrite the marked region of docs/architecture.md

The region runs from the BEGIN marker line to the END marker line. `tests/unit/test_docs.py` fails while it
differs from `render()`: change a contract, then run the `--write` command.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testkit.paths import REPO

PYPROJECT = REPO / "pyproject.toml"
DOC = REPO / "docs" / "architecture.md"
COMMAND = "python -m testkit.layers_doc --write"
BEGIN = f"<!-- BEGIN layers: generated from pyproject.toml's [tool.importlinter] by `{COMMAND}` -->"
END = "<!-- END layers -->"
WIDTH = 112
IMPORTS, FORBIDS = " ─▶ ", " ─✗ "
LEGEND = ["a ─▶ b ─▶ c: a may import b and c, b may import c, never the reverse",
          "a | b: one layer of modules that never import each other (a : b: that may)",
          "a ─✗ b, c: a never imports b or c ([direct imports only]: a may import a module that imports them)"]


def contracts(pyproject: Path = PYPROJECT) -> list[Mapping[str, Any]]:
    """The import-linter contracts, in the file's order."""
    with pyproject.open("rb") as f:
        return list(tomllib.load(f)["tool"]["importlinter"]["contracts"])


def wrap(items: Sequence[str], separator: str) -> list[str]:
    """`items` joined by `separator` in lines of at most WIDTH columns. A list of layers breaks before an
    arrow (the continuation starts with it), any other list after its separator."""
    lines = ["  " + items[0]]
    for item in items[1:]:
        if len(lines[-1]) + len(separator) + len(item) <= WIDTH:
            lines[-1] += separator + item
        elif separator == IMPORTS:
            lines.append("    " + separator.lstrip() + item)
        else:
            lines[-1] += separator.rstrip()
            lines.append("    " + item)
    return lines


def contract_lines(contract: Mapping[str, Any]) -> list[str]:
    """One contract: its name, then what it allows or forbids."""
    kind = contract["type"]
    title = contract["name"]
    if kind == "layers":
        containers = contract.get("containers", [])
        if containers:
            title += f"  (inside {', '.join(containers)})"
        return [title, *wrap(list(contract["layers"]), IMPORTS)]
    if kind == "forbidden":
        direct = "  [direct imports only]" if contract.get("allow_indirect_imports") else ""
        sources = ", ".join(contract["source_modules"])
        forbidden = list(contract["forbidden_modules"])
        return [title + direct, *wrap([sources + FORBIDS + forbidden[0], *forbidden[1:]], ", ")]
    modules = [str(m) for key, value in contract.items() if key.endswith("modules") for m in value]
    return [f"{title}  [{kind}]", *wrap(modules or ["(no modules)"], ", ")]


def render(pyproject: Path = PYPROJECT) -> str:
    """The whole marked region of docs/architecture.md, markers included."""
    body = list(LEGEND)
    for contract in contracts(pyproject):
        body += ["", *contract_lines(contract)]
    return "\n".join([BEGIN, "```", *body, "```", END]) + "\n"


def span(text: str) -> tuple[int, int]:
    """Where the marked region is in `text` (from the BEGIN line to the end of the END line)."""
    marker = BEGIN.split(":")[0]
    if text.count(marker) != 1 or text.count(END) != 1:
        raise ValueError(f"{DOC.name} must hold one `{marker} ...` line and one `{END}` line")
    start, end = text.index(marker), text.index(END) + len(END) + 1
    if end <= start:
        raise ValueError(f"{END} comes before the BEGIN marker")
    return start, end


def region(text: str) -> str:
    start, end = span(text)
    return text[start:end]


def rewrite(text: str, pyproject: Path = PYPROJECT) -> str:
    start, end = span(text)
    return text[:start] + render(pyproject) + text[end:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite the marked region of {DOC}")
    args = parser.parse_args(argv)
    if args.write:
        DOC.write_text(rewrite(DOC.read_text()))
    else:
        sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
