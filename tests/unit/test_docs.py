"""The documents say only what the code has: README.md, every docs/*.md and every research/*.md.

Rules (each a small matcher below; `test_matchers_catch_made_up_names` proves each can fail):

1. **Sidecar flags.** A `--flag` is the sidecar's, and must be a flag of `loadaware.config.SETTINGS`, when it
   is written (a) in a command that runs `loadaware-sidecar` (a code-block line naming it, with its `\\`
   continuation lines, or an inline code span naming it), or (b) in an inline code span that starts with `--`
   (`` `--tokenizer` ``, `` `--policy auto` ``), except in the documents that also describe other tools' flags
   (OTHER_CLI_DOCS: the lab notebook, the results, the developer guide), where only (a) applies. Write another
   tool's flag inside its command (`` `vllm serve --kv-events-config ...` ``), never alone. A `--policy VALUE`
   in a sidecar command or span must name `auto` or one of `loadaware.policies.POLICY_NAMES`.
2. **Environment variables.** Every `LOADAWARE_*` name is a setting's variable (`LOADAWARE_TLS_*` is a prefix
   that must match one; `LOADAWARE_NAME` itself is the placeholder for any).
3. **Metric names.** Every `loadaware_name` is a metric the sidecar declares (a `Counter`, `Gauge` or
   `Histogram` whose name is a string literal in loadaware/): a counter as `name` or `name_total`, a histogram
   as `name`, `name_bucket`, `name_sum` or `name_count`. `name_*` is a prefix that must match one,
   `name_{a,b}` expands. NOT_METRICS lists the few `loadaware_` identifiers that are not metrics, each with the
   file that must hold it.
4. **Paths.** Every link target is a file or folder of the repository (no URL, no absolute path, nothing above
   the root; a `#anchor` into a Markdown file must be one of its headings), and so is every repository path in
   an inline code span or in a code block: a `/`-separated name whose first part is a top-level entry of the
   repository (`envoy/envoy.yaml`, `k8s/base`), or, in a code span, one ending in a source or config suffix
   (`.py`, `.yaml`, ...), looked up from the root, then beside the document, then in `loadaware/` (the package
   paths docs/architecture.md writes, like `routing/pipeline.py`). `path::test` and `path:LINE` are checked
   as `path`. Run outputs and virtual environments (GENERATED) are not in the repository and are not checked.
   Another project's file is written `project:path` (`envoy:source/...`), which is not a repository path.
5. **Modules.** Every dotted name rooted at one of the projects (`python -m bench.run`, `loadaware.prefix.queued`,
   `loadaware.config.SETTINGS`) is a module, or a name its module defines: tests/unit/test_doc_paths.py's rule
   3, `module_problems`, which knows the names that are not modules (the trace span's attributes, the gRPC
   package).

docs/architecture.md's "Adding a policy", "Adding a prefix source" and "Adding a scraped signal" sections are
worked examples of things that do not exist: they are left out here, and tests/unit/test_adding_a_policy.py,
test_adding_a_prefix_source.py and test_adding_a_scraped_signal.py run their code as written instead.

docs/operations.md's "What each panel answers at 3 a.m." table lists exactly the dashboard's panels.
docs/configuration.md is generated from the settings table: it must equal `testkit.config_doc.render()`.
docs/architecture.md's layer diagram (between its `BEGIN layers` and `END layers` lines) is generated from the
import-linter contracts in pyproject.toml: it must equal `testkit.layers_doc.render()`.

tests/unit/test_doc_paths.py checks the paths and modules that comments, docstrings and pyproject.toml name.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

from loadaware.config import SETTINGS
from loadaware.policies import POLICY_NAMES
from loadaware.policies.auto import AUTO
from testkit import config_doc, layers_doc
from testkit.paths import REPO
from tests.unit.test_doc_paths import module_problems

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "research").glob("*.md"))]
OTHER_CLI_DOCS = {"notebook.md", "results.md", "development.md"}
GENERATED = ("out/", "build/", ".venv/", ".lmcache-venv/", ".peers-venv/", ".vllm-venv/")
NOT_METRICS = {"loadaware_sidecar": "envoy/envoy.yaml"}  # the Envoy cluster that reaches the sidecar
PATH_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".md", ".proto", ".toml", ".txt", ".png", ".csv", ".svg")

FLAGS = {s.flag for s in SETTINGS}
ENVS = {s.env for s in SETTINGS}
POLICIES = {AUTO, *POLICY_NAMES}
TOP_LEVEL = {p.name for p in REPO.iterdir()} - {".git"}

_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*[a-z0-9])")
_POLICY_VALUE = re.compile(r"(?<![\w-])--policy[ =]([A-Za-z0-9_-]+)")
_ENV = re.compile(r"\bLOADAWARE_[A-Z0-9_]*(?:\*)?")
_METRIC = re.compile(r"\bloadaware_[a-z0-9_]*(?:\*|\{[a-z0-9_,]+\})?")
_SPAN = re.compile(r"``(.+?)``|`([^`\n]+)`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
_PATH = re.compile(r"^[\w.-]+(?:/[\w.-]*)+$")
PLACEHOLDER_ENV = "LOADAWARE_NAME"
DASHBOARD = REPO / "k8s" / "monitoring" / "loadaware-dashboard.json"


# ---- what the code has ----

def declared_metrics() -> dict[str, str]:
    """Every `loadaware_*` metric the sidecar declares: name -> Counter, Gauge or Histogram (TableGauge and
    TableCounter, the per-endpoint kinds kept as plain numbers, export as a Gauge and a Counter)."""
    out: dict[str, str] = {}
    for path in (REPO / "loadaware").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("Counter", "Gauge", "TableGauge", "TableCounter", "Histogram") and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                    and node.args[0].value.startswith("loadaware_")):
                out[node.args[0].value] = node.func.id.removeprefix("Table")
    return out


def exported_names(declared: dict[str, str]) -> set[str]:
    names: set[str] = set()
    suffixes = {"Counter": ("", "_total"), "Gauge": ("",), "Histogram": ("", "_bucket", "_sum", "_count")}
    for name, kind in declared.items():
        names.update(name + suffix for suffix in suffixes[kind])
    return names


METRICS = exported_names(declared_metrics())


def headings(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    anchors: set[str] = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6} (.+)", line)):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


# ---- the matchers: each returns the problems it finds in one document's text ----

def code_blocks(text: str) -> Iterator[str]:
    """The lines of fenced code blocks, with `\\` continuations joined."""
    in_code, joined = False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            joined += line.rstrip().removesuffix("\\") + " "
            if not line.rstrip().endswith("\\"):
                yield joined
                joined = ""


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    out, in_code = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code:
            out.append(line)
    return "\n".join(out)


def spans(text: str) -> list[str]:
    return [a or b for a, b in _SPAN.findall(prose(text))]


def sidecar_flag_problems(text: str, all_spans: bool = True) -> list[str]:
    """Rule 1: flags in the sidecar's commands (and, with all_spans, in code spans starting with `--`)."""
    contexts = [line for line in code_blocks(text) if "loadaware-sidecar" in line]
    contexts += [s for s in spans(text) if "loadaware-sidecar" in s or (all_spans and s.startswith("--"))]
    problems = []
    for context in contexts:
        problems += [f"--{f}: no such sidecar flag" for f in _FLAG.findall(context) if f"--{f}" not in FLAGS]
        problems += [f"--policy {p}: no such policy" for p in _POLICY_VALUE.findall(context) if p not in POLICIES]
    return problems


def env_problems(text: str) -> list[str]:
    """Rule 2."""
    problems = []
    for name in _ENV.findall(text):
        if name.endswith("*"):
            if not any(env.startswith(name[:-1]) for env in ENVS):
                problems.append(f"{name}: matches no setting's variable")
        elif name not in ENVS and name != PLACEHOLDER_ENV:
            problems.append(f"{name}: no setting has this variable")
    return problems


def metric_problems(text: str, metrics: set[str] = METRICS) -> list[str]:
    """Rule 3."""
    problems = []
    for token in _METRIC.findall(text):
        if token.endswith("*"):
            names = [n for n in metrics if n.startswith(token[:-1])]
        elif token.endswith("}"):
            base, _, alternatives = token[:-1].partition("{")
            names = [base + a for a in alternatives.split(",")] if base.endswith("_") else [base]
        else:
            names = [token]
        for name in names or [token]:
            if name not in metrics and name not in NOT_METRICS:
                problems.append(f"{name}: no such metric")
    return problems


def exists(target: str, doc: Path) -> bool:
    target = re.sub(r"(::.*|:\d+(-\d+)?)$", "", target)
    return any((base / target).exists() for base in (REPO, doc.parent, REPO / "loadaware"))


def path_problems(text: str, doc: Path) -> list[str]:
    """Rule 4."""
    problems = []
    for target in _LINK.findall(prose(text)):
        file, _, anchor = target.partition("#")
        if re.match(r"[a-z]+:", file) or file.startswith("/"):
            problems.append(f"{target}: points outside the repository")
            continue
        resolved = (doc.parent / file).resolve() if file else doc
        if not resolved.is_relative_to(REPO) or not resolved.exists():
            problems.append(f"{target}: no such file in the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in headings(resolved):
            problems.append(f"{target}: no such heading")
    candidates = [s.strip() for s in spans(text)]
    candidates = [s for s in candidates if _PATH.match(re.sub(r"(::.*|:\d+(-\d+)?)$", "", s))
                  and (s.split("/")[0] in TOP_LEVEL or s.endswith(PATH_SUFFIXES))]
    candidates += [token for line in code_blocks(text) for token in line.split()
                   if _PATH.match(token) and token.split("/")[0] in TOP_LEVEL]
    for path in candidates:
        if not path.startswith(GENERATED) and not exists(path, doc):
            problems.append(f"{path}: no such file in the repository")
    return problems


# In docs/architecture.md, each run by its tests/unit/test_adding_a_*.py.
WORKED_EXAMPLES = ("## Adding a policy", "## Adding a prefix source", "## Adding a scraped signal")


def without_worked_example(text: str) -> str:
    for heading in WORKED_EXAMPLES:
        if heading in text:
            start = text.index(heading)
            end = text.find("\n## ", start + 1)
            text = text[:start] + (text[end:] if end >= 0 else "")
    return text


def problems_of(doc: Path) -> list[str]:
    text = without_worked_example(doc.read_text())
    return (sidecar_flag_problems(text, all_spans=doc.name not in OTHER_CLI_DOCS) + env_problems(text)
            + metric_problems(text) + path_problems(text, doc) + module_problems(text))


# ---- the tests ----

def test_configuration_doc_is_generated_from_the_settings_table() -> None:
    assert (REPO / "docs" / "configuration.md").read_text() == config_doc.render(), (
        f"docs/configuration.md is stale: regenerate it with `{config_doc.COMMAND}`")


def test_architecture_layer_diagram_is_generated_from_the_import_contracts() -> None:
    assert layers_doc.region(layers_doc.DOC.read_text()) == layers_doc.render(), (
        f"docs/architecture.md's layer diagram is stale: regenerate it with `{layers_doc.COMMAND}`")


def test_layer_diagram_shows_every_module_of_every_contract(tmp_path: Path) -> None:
    diagram = layers_doc.render()
    for contract in layers_doc.contracts():
        for layer in contract.get("layers", []):
            assert f"{layer} ─▶ " in diagram or f"─▶ {layer}" in diagram, layer
        for key in ("containers", "source_modules", "forbidden_modules"):
            for module in contract.get(key, []):
                assert module in diagram, (key, module)
    changed = tmp_path / "pyproject.toml"
    changed.write_text(layers_doc.PYPROJECT.read_text().replace('"cli",', '"cli",\n  "made_up",', 1))
    assert "cli ─▶ made_up ─▶ app" in layers_doc.render(changed)
    doc = "before\n" + layers_doc.render() + "after\n"
    assert layers_doc.rewrite(doc, changed) == "before\n" + layers_doc.render(changed) + "after\n"


def test_every_flag_variable_metric_path_and_module_in_the_docs_exists() -> None:
    found = {str(doc.relative_to(REPO)): problems for doc in DOCS if (problems := sorted(set(problems_of(doc))))}
    assert not found, json.dumps(found, indent=2)


def test_operations_doc_answers_for_every_dashboard_panel() -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    table = text[text.index("What each panel answers at 3 a.m."):]
    table = table[:table.index("\n\n", table.index("| row |"))]
    listed = {cells[2].strip() for line in table.splitlines() if line.startswith("| ")
              and len(cells := line.split("|")) > 3} - {"panel", "---"}
    panels = {p["title"] for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"}
    assert listed == panels


def test_the_non_metric_names_are_where_they_are_said_to_be() -> None:
    for name, path in NOT_METRICS.items():
        assert name in (REPO / path).read_text(), (name, path)
        assert name not in METRICS


def test_matchers_catch_made_up_names() -> None:
    doc = REPO / "docs" / "made-up.md"
    text = """
```sh
.venv/bin/loadaware-sidecar serve --listen 127.0.0.1:9002 \\
  --no-such-flag 1 --policy predictive-ish
python -m experiment.grid --seeds 20
```
Set `--tokenizer` and `--made-up-knob`, or `LOADAWARE_MADE_UP`; watch `loadaware_made_up_total` and
`loadaware_decisions_total{outcome}`; read `loadaware/nowhere.py`, `envoy/envoy.yaml`, `routing/pipeline.py`
and [the page](../docs/nowhere.md), [policies](policies.md#no-such-heading), [web](https://example.com).
"""
    assert sorted(sidecar_flag_problems(text)) == ["--made-up-knob: no such sidecar flag",
                                                   "--no-such-flag: no such sidecar flag",
                                                   "--policy predictive-ish: no such policy"]
    assert sidecar_flag_problems("`python -m bench.run --cases table`", all_spans=False) == []
    assert sidecar_flag_problems("`--seeds 20`", all_spans=False) == []
    assert env_problems(text) == ["LOADAWARE_MADE_UP: no setting has this variable"]
    assert env_problems("`LOADAWARE_TLS_*`, `LOADAWARE_NOPE_*`, `LOADAWARE_NAME`") == [
        "LOADAWARE_NOPE_*: matches no setting's variable"]
    assert metric_problems(text) == ["loadaware_made_up_total: no such metric"]
    assert metric_problems("`loadaware_engine_{running,nope}`") == ["loadaware_engine_nope: no such metric"]
    assert metric_problems("`loadaware_decision_seconds_bucket`, `loadaware_approx_*`, `loadaware_sidecar`") == []
    assert module_problems("`python -m bench.nowhere`, `loadaware.route`, `loadaware.v1.Router`") == [
        "bench.nowhere: no such module"]
    assert path_problems("`envoy:source/extensions/override_host/load_balancer.cc`, `/etc/x.yaml`", doc) == []
    assert sorted(path_problems(text, doc)) == ["../docs/nowhere.md: no such file in the repository",
                                                "https://example.com: points outside the repository",
                                                "loadaware/nowhere.py: no such file in the repository",
                                                "policies.md#no-such-heading: no such heading"]
