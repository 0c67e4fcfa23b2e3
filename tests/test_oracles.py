"""tests/oracles.py's `require`: a missing oracle skips a test on a developer's machine
and fails it, naming what is missing, when CI is set. Shown on a real test module,
tests/test_ckpt_hf.py (torch at its top), run by pytest in a process where torch
cannot be imported (an import blocker loaded as a pytest plugin; the venv keeps it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.oracles import in_ci, require

ROOT = Path(__file__).resolve().parents[1]
BLOCKER = '''import sys


class NoTorch:
    """Every import of torch fails as if it were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoTorch())
'''


def pytest_without_torch(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "no_torch.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    if ci is not None:
        env["CI"] = ci
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no_torch", "-p",
               "no:cacheprovider", "tests/test_ckpt_hf.py"]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_in_ci_a_missing_torch_fails_the_run_naming_it(tmp_path):
    done = pytest_without_torch(tmp_path, "1")
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "ERROR collecting tests/test_ckpt_hf.py" in out
    assert "torch is missing: cannot import it (No module named 'torch')" in out
    assert "skipped" not in out


def test_outside_ci_a_missing_torch_skips_saying_why(tmp_path):
    done = pytest_without_torch(tmp_path, None)
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, out
    assert "1 skipped" in out and "torch is missing" in out


@pytest.mark.parametrize(
    "value, ci", [("1", True), ("true", True), ("yes", True), ("", False), ("0", False),
                  ("false", False), ("False", False), (None, False)],
)  # fmt: skip
def test_what_counts_as_ci(value, ci, monkeypatch):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert in_ci() is ci


@pytest.mark.parametrize("ci, outcome", [("1", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_program_not_on_path(ci, outcome, monkeypatch, tmp_path):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder
    with pytest.raises(outcome, match="^shellcheck is missing: not on PATH"):
        require("shellcheck")
    (tmp_path / "shellcheck").write_text("#!/bin/sh\n")
    (tmp_path / "shellcheck").chmod(0o755)
    assert require("shellcheck") == str(tmp_path / "shellcheck")


def test_a_module_that_imports_is_returned():
    assert require("json").dumps([1]) == "[1]"
