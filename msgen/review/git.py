"""`--base REF`: a spec as it was at a git revision (`git show REF:./name`, run in
the spec's folder, so the path is the spec's own wherever the repository's top is)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from msgen.base.status import UsageError


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=folder, capture_output=True, check=False)
    except OSError as exc:
        raise UsageError(
            f"--base needs git, which could not be run: {exc.strerror or exc}"
        ) from exc


def spec_at(ref: str, spec: Path) -> str:
    """The text of `spec` at revision `ref`; a usage error outside a repository, for
    an unknown revision, or when the spec did not exist there."""
    folder = spec.parent if str(spec.parent) else Path(".")
    if ref.startswith("-"):
        raise UsageError(f"--base {ref}: a revision cannot start with '-'")
    inside = _git(folder, "rev-parse", "--is-inside-work-tree")
    if inside.returncode != 0 or inside.stdout.strip() != b"true":
        raise UsageError(f"--base {ref}: {spec} is not in a git repository")
    if _git(folder, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode != 0:
        raise UsageError(f"--base {ref}: no such revision in the repository of {spec}")
    shown = _git(folder, "show", f"{ref}:./{spec.name}")
    if shown.returncode != 0:
        raise UsageError(f"--base {ref}: {spec} did not exist at {ref}")
    try:
        return shown.stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"--base {ref}: {spec} at {ref} is not UTF-8 text") from exc
