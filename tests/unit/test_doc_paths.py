"""The code's own words name only what the repository has: paths and modules in comments, docstrings and
pyproject.toml.

tests/unit/test_docs.py checks the Markdown documents; this checks what the code says about itself, in the
comments and docstrings (module, class and function) of every `.py` file under SOURCES (but the generated
`*_pb2*.py`), and in every line of pyproject.toml (its comments and its values).

Rules (`test_matchers_catch_made_up_names` proves each can fail):

1. **Paths.** A repository path is a `/`-separated name (`loadaware/prefix/source.py`, `routing/pruning.py`,
   `docs/architecture.md`, `kvevents/feeds.py`, `k8s/base`) whose first part is ours: a top-level entry of
   the repository, a former one (FORMER_TOP_LEVEL: the package's old name, whose paths are always stale), a
   folder of `loadaware/`, or a folder beside the naming file or in a folder above it. It must exist,
   looked up (a) from the repository root, (b) from `loadaware/` (the package paths the documents write,
   like `routing/pipeline.py`), or (c) beside the naming file or from any folder above it (so
   `loadaware/prefix/kvevents/query.py` may write `feeds.py`'s sibling as `kvevents/feeds.py`). A trailing
   `.` or `/` is dropped; `path:LINE`, `path::test` and `path#anchor` are checked as `path`, and so is a
   section cited after it (`docs/architecture.md, "Invariants"`: only the file must exist). A path whose
   first part is none of ours is another project's (vLLM's `vllm/v1/core/kv_cache_utils.py`, transformers'
   `src/transformers/...`) and is not checked; nor is one written `project:path`, a URL, or a run output or
   virtual environment (GENERATED).
2. **Bare module files.** A `.py` name without a `/` (`feeds.py`) must be a file beside the naming file, in a
   folder above it, or in `loadaware/`. Another project's module is written with its path or as
   `project:name.py` (`lmcache:controller_manager.py`). Other bare file names (`report.md`, `envoy.yaml`)
   are not checked: they are as often a run output's or a generated file's name.
3. **Modules.** A dotted name rooted at one of our projects (`loadaware.prefix.queued`,
   `testkit.config_doc.render`) must be a module: each part a package or a module of the one before, until
   a module, whose next part (if any) must be a name it defines at top level (a `def`, `class`, assignment
   or import; `NAME_*` a prefix of one). Further parts (attributes of that name) are not checked. A name
   ending in a file suffix (`loadaware.yaml`) is a file, not a module; nor is a name the sidecar writes as a
   string (a `loadaware.*` string literal in loadaware/: the trace span `loadaware.route` and its attributes),
   nor one of NOT_MODULES (the gRPC package `loadaware.v1`); a part in PLACEHOLDERS stands for any module
   (`python -m experiment.MODULE`). tests/unit/test_docs.py applies this rule to the documents too.

The failure lists every stale reference as `file:line: name: why`.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from testkit.paths import REPO

SOURCES = ("loadaware", "sim", "testkit", "bench", "experiment", "demo", "research")
PROJECTS = SOURCES + ("tests",)  # the roots of a dotted module name
CONFIG = REPO / "pyproject.toml"
PACKAGE = REPO / "loadaware"
FORMER_TOP_LEVEL = {"sidecar": "the package's name before it moved to loadaware/ (a60ba3c)"}
GENERATED = ("out", "build", ".venv", ".lmcache-venv", ".peers-venv", ".vllm-venv")
NOT_MODULES = {"loadaware.v1": "proto/loadaware/v1/loadaware.proto"}  # the API's gRPC package, in its file
PLACEHOLDERS = {"MODULE", "NAME"}
FILE_SUFFIXES = ("py", "md", "yaml", "yml", "json", "toml", "txt", "proto", "sh", "csv", "svg", "png", "log",
                 "html", "cfg", "ini", "lock", "jsonl", "gz")

# a path: not inside a URL, a `project:path`, another path, an identifier or a `~/`/`$VAR/` expansion
_PATH = re.compile(r"(?<![\w./:@~$<{\\-])([\w.-]*\w(?:/[\w.-]+)+)/?")
_BARE = re.compile(r"(?<![\w./:@~$<{\\-])([A-Za-z_]\w*\.py)(?![\w/-])")
_MODULE = re.compile(r"(?<![\w./:@\\-])((?:" + "|".join(PROJECTS) + r")(?:\.[A-Za-z_]\w*)+\*?)(?![\w-]|/)")


# ---- what the code says about itself ----

def commented_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each comment and each line of each docstring of a Python file."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str) and first.end_lineno is not None):
                for number in range(first.lineno, first.end_lineno + 1):
                    yield number, lines[number - 1]


def sources() -> list[Path]:
    return sorted(p for root in SOURCES if (REPO / root).is_dir() for p in (REPO / root).rglob("*.py")
                  if "__pycache__" not in p.parts and "_pb2" not in p.name)


# ---- the matchers ----

def bases(file: Path) -> list[Path]:
    """Where a path named in `file` is looked up: the root, loadaware/, beside the file and each folder above."""
    above = [d for d in file.parents if d.is_relative_to(REPO) and d != REPO]
    return [REPO, PACKAGE, *above]


def is_ours(path: str, file: Path) -> bool:
    first = path.split("/")[0]
    if first in FORMER_TOP_LEVEL:
        return True
    return any((base / first).exists() for base in bases(file)) and first not in GENERATED


def path_problems(text: str, file: Path) -> list[str]:
    """Rules 1 and 2 for one line of text named in `file`."""
    problems = []
    for token in _PATH.findall(text):
        path = token.rstrip("./")
        if "/" not in path or not is_ours(path, file):
            continue
        if not any((base / path).exists() for base in bases(file)):
            problems.append(f"{path}: no such file in the repository")
    for name in _BARE.findall(text):
        if not any((base / name).exists() for base in bases(file)):
            problems.append(f"{name}: no such file beside {file.name}, above it or in loadaware/")
    return problems


@cache
def top_level_names(module: Path) -> frozenset[str] | None:
    """The names a module defines at top level (under an `if` or `try` too), or None when it can have any
    (`__getattr__`, `import *`)."""
    names: set[str] = set()
    body = list(ast.parse(module.read_text()).body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):
            body += [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)]
            body += [n for handler in getattr(node, "handlers", []) for n in handler.body]
    return None if "__getattr__" in names else frozenset(names)


def defines(names: frozenset[str] | None, part: str) -> bool:
    if names is None or part in PLACEHOLDERS:
        return True
    return any(n.startswith(part[:-1]) for n in names) if part.endswith("*") else part in names


@cache
def sidecar_strings() -> frozenset[str]:
    """Every dotted `loadaware.*` string literal in loadaware/ (the trace span's name and its attributes')."""
    return frozenset(node.value for path in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.Constant) and isinstance(node.value, str)
                     and re.fullmatch(r"loadaware(\.\w+)+", node.value))


def module_exists(dotted: str) -> bool:
    parts = dotted.split(".")
    if any(dotted == name or dotted.startswith(name + ".") for name in NOT_MODULES) or dotted in sidecar_strings():
        return True
    here = REPO / parts[0]
    for part in parts[1:]:
        if here.is_dir():
            if (here / f"{part}.py").exists():
                here = here / f"{part}.py"
            elif (here / part).is_dir():
                here = here / part
            else:
                init = here / "__init__.py"
                return defines(top_level_names(init) if init.exists() else frozenset(), part)
        else:
            return defines(top_level_names(here), part)
    return here.exists()


def module_problems(text: str) -> list[str]:
    """Rule 3 for one line of text."""
    return [f"{name}: no such module" for name in _MODULE.findall(text)
            if name.rsplit(".", 1)[-1] not in FILE_SUFFIXES and not module_exists(name)]


def problems() -> list[str]:
    """Every stale reference, as `file:line: name: why`."""
    found = []
    named: list[tuple[Path, int, str]] = [(f, n, t) for f in sources() for n, t in commented_lines(f)]
    named += [(CONFIG, n, t) for n, t in enumerate(CONFIG.read_text().splitlines(), 1)]
    for file, number, text in named:
        for problem in path_problems(text, file) + module_problems(text):
            found.append(f"{file.relative_to(REPO)}:{number}: {problem}")
    return sorted(set(found), key=lambda line: (line.split(":")[0], int(line.split(":")[1]), line))


# ---- the tests ----

def test_every_path_and_module_named_in_comments_docstrings_and_pyproject_exists() -> None:
    stale = problems()
    assert not stale, f"{len(stale)} stale references:\n" + "\n".join(stale)


def test_the_not_modules_are_what_they_are_said_to_be() -> None:
    for name, path in NOT_MODULES.items():
        assert f"package {name};" in (REPO / path).read_text(), (name, path)
        assert not (REPO / name.replace(".", "/")).exists() and not (REPO / f"{name.replace('.', '/')}.py").exists()
    assert {"loadaware.route", "loadaware.policy"} <= sidecar_strings()


def test_matchers_catch_made_up_names() -> None:
    file = PACKAGE / "prefix" / "kvevents" / "made_up.py"
    text = ("see loadaware/nowhere.py, routing/pruning.py, routing/nowhere.py:12, docs/architecture.md, "
            "\"Invariants\", docs/nowhere.md#x, kvevents/feeds.py, kvevents/gone.py, sidecar/api/v1, "
            "vllm/v1/core/kv_cache_utils.py, envoy:source/x.cc, https://example.com/docs/x.md, out/x/y.json, "
            "in-flight/scraped, k8s/base. feeds.py, lmcache.py, lmcache:controller_manager.py")
    assert path_problems(text, file) == ["loadaware/nowhere.py: no such file in the repository",
                                         "routing/nowhere.py: no such file in the repository",
                                         "docs/nowhere.md: no such file in the repository",
                                         "kvevents/gone.py: no such file in the repository",
                                         "sidecar/api/v1: no such file in the repository",
                                         "lmcache.py: no such file beside made_up.py, above it or in loadaware/"]
    assert path_problems("kvevents/feeds.py", REPO / "sim" / "made_up.py") == []  # not ours from sim/
    assert path_problems("prefix/kvevents/feeds.py", REPO / "sim" / "made_up.py") == []
    text = ("`loadaware.prefix.queued`, `loadaware.prefix.nowhere`, `testkit.config_doc.render()`, "
            "`testkit.config_doc.no_such_name`, `loadaware.v1.Router`, `sim.nowhere`, policies/loadaware.py, "
            "`testkit.config_doc.COMM*`, `testkit.config_doc.NOPE_*`, `python -m experiment.MODULE`, "
            "loadaware.yaml, loadaware-sidecar, python -m bench.run")
    assert module_problems(text) == ["loadaware.prefix.nowhere: no such module",
                                     "testkit.config_doc.no_such_name: no such module",
                                     "sim.nowhere: no such module",
                                     "testkit.config_doc.NOPE_*: no such module"]
