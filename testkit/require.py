"""A test's real component is missing: skipped on a developer's machine, FAILED under CI=true.

A suite that skips when LMCache, Envoy, curl or a reference library is absent lets a broken install turn CI
green. So every such check goes through here:

    pytestmark = requires_lmcache()          # or requires(component, available, hint) for any other
    require("curl", shutil.which("curl") is not None, "install curl")        # inside a test or a fixture
    transformers = require_module("transformers", "pip install -e '.[dev]'")  # pytest.importorskip's stand-in

With CI set to true (or 1, yes), a missing component fails the test instead (and `require_module` at a
module's top fails its collection). tests/conftest.py loads this module as a pytest plugin: it applies the
`requires` marks and, under CI=true, fails the whole run if any test was skipped for a missing component by
other means (a plain pytest.skip or importorskip whose reason says something is missing or not installed).
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Mapping
from types import ModuleType
from typing import NoReturn

import pytest

CI_ENV = "CI"
SKIP_PREFIX = "missing component: "
# A skip reason that says something is absent: caught under CI=true even when it bypassed this module.
_MISSING = re.compile(r"missing|not installed|not present|not found|no module named|could not import", re.I)
_MARK = "requires"


def in_ci(environ: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if environ is None else environ).get(CI_ENV, "")
    return value.strip().lower() in ("1", "true", "yes")


def missing(component: str, hint: str) -> NoReturn:
    """Skip (locally) or fail (CI=true) the current test, naming the component and how to install it."""
    reason = f"{SKIP_PREFIX}{component} ({hint})"
    if in_ci():
        pytest.fail(f"{reason}; {CI_ENV}=true: a missing component fails instead of skipping", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(component: str, available: bool, hint: str) -> None:
    if not available:
        missing(component, hint)


def require_module(name: str, hint: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"Python module {name} ({exc})", hint)


def requires(component: str, available: bool, hint: str) -> pytest.MarkDecorator:
    """A mark for `pytestmark` or one test: checked when each test sets up (see `require`)."""
    return getattr(pytest.mark, _MARK)(component=component, available=bool(available), hint=hint)


def requires_lmcache() -> pytest.MarkDecorator:
    """The real LMCache controller, from its own virtual environment (`make lmcache`)."""
    from testkit.lmcache import CONTROLLER_BINARY

    return requires("LMCache controller", CONTROLLER_BINARY.exists(), f"no {CONTROLLER_BINARY}: make lmcache")


def is_missing_component(reason: str) -> bool:
    return reason.startswith(SKIP_PREFIX) or bool(_MISSING.search(reason))


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


# ---- the pytest plugin (tests/conftest.py: pytest_plugins) -----------------------------------------------

class _MissingComponentSkips:
    """Every skip whose reason says a component is missing; under CI=true they fail the run."""

    def __init__(self) -> None:
        self.skips: list[str] = []

    def _note(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = _skip_reason(report)
            if is_missing_component(reason):
                self.skips.append(f"{report.nodeid}: {reason}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._note(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._note(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not (self.skips and in_ci()):
            return
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", f"{CI_ENV}=true: {len(self.skips)} skipped for a missing component", red=True)
            for line in self.skips:
                reporter.write_line(line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{_MARK}(component, available, hint): the test needs a real component; "
                                       "skipped without it, failed under CI=true (testkit/require.py)")
    config.pluginmanager.register(_MissingComponentSkips(), "loadaware-missing-component-skips")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers(_MARK):
        require(mark.kwargs["component"], mark.kwargs["available"], mark.kwargs["hint"])
