"""The worked examples of docs/architecture.md's "Adding a ..." sections, run as written: each section's first
Python block is a new module, its second the one registry line that adds it (executed by
tests/unit/test_adding_a_policy.py, tests/unit/test_adding_a_prefix_source.py and
tests/unit/test_adding_a_scraped_signal.py)."""

from __future__ import annotations

import re
import sys
import types

import pytest

from testkit.paths import REPO


def example_blocks(heading: str) -> list[str]:
    """The Python blocks of the section `## {heading}`, in order."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text[text.index(f"## {heading}"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def example_module(monkeypatch: pytest.MonkeyPatch, heading: str, module_name: str) -> tuple[types.ModuleType, str]:
    """The section's module, executed under `module_name` (in sys.modules for the test's duration), and its
    registry line."""
    module_code, registry_line = example_blocks(heading)
    module = types.ModuleType(module_name)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(module_code, module.__name__, "exec"), module.__dict__)
    return module, registry_line
