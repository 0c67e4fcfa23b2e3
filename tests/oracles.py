"""The independent oracles some tests need and msgen does not: torch and transformers
(the Hugging Face models), MindSpore (the generated code's runtime), safetensors and
jsonschema (others' readers of what msgen writes), shellcheck (the launch scripts'
lint) and Chromium (the report's HTML).

`require(name)` gives a module or a program's path. Missing, it skips the test on a
developer's machine, saying why; with the environment variable CI set (to anything
but "", "0" or "false"; .ci/run sets CI=1) it fails the test, or the module's
collection, naming what is missing: in CI an oracle that is not installed must not
turn its tests into skips.
"""

from __future__ import annotations

import importlib
import os
import shutil

import pytest

# Programs, found on PATH; every other name is a module to import.
PROGRAMS = {
    "shellcheck": "lints the generated launch scripts",
    "chromium": "opens msgen report's HTML headless",
}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def missing(name: str, why: str):
    """Fail under CI, else skip (at module level too: a module's oracle at its top)."""
    message = f"{name} is missing: {why}"
    if in_ci():
        pytest.fail(f"{message} (CI is set: an oracle that is not installed fails)", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require(name: str):
    """The module `name`, imported, or the path of the program `name` (PROGRAMS)."""
    if name in PROGRAMS:
        path = shutil.which(name)
        if path is None:
            missing(name, f"not on PATH; it {PROGRAMS[name]} (.ci/run installs it)")
        return path
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        error = str(exc)  # said outside the handler: no chained traceback above it
    missing(name, f"cannot import it ({error}); `pip install -e '.[test]'` installs it")
