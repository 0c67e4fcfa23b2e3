"""The compiled tree doctor checks the host for: the `--set` flags its manifest records,
applied to the spec so that every check sees the compiled device count, mesh and
checkpoints (the launch scripts run `msgen doctor SPEC --tree <the tree>`, without the
flags), and its plan.json, which sizes a rank's checkpoint exactly.

A tree is the spec's when its manifest records the spec's sha256; then its flags apply
unless `--set` is given. Its plan.json is read only when the flags it was compiled with
are the ones the checks use, so that the sizes are of the checked plan.
"""

from __future__ import annotations

import json
from pathlib import Path

from msgen.base.tree import compiled_record

PLAN = "plan.json"
PLAN_CAP = 64 << 20  # bytes; a 4,096-device plan.json is some 135 KB


def default_tree(spec) -> Path:
    """Where `msgen compile SPEC -o generated/` writes the tree (doctor's default)."""
    return Path("generated") / spec.model.name


def tree_sets(spec, given: tuple[str, ...], tree: Path | None) -> tuple[str, ...] | None:
    """The flags to check the host with when they are not `given`: those the tree
    records, when it was compiled from this spec with some; None otherwise."""
    if given or spec is None:
        return None
    record = compiled_record(tree or default_tree(spec))
    if record is None or record.spec_sha256 != spec.sha256 or not record.sets:
        return None
    return record.sets


def compiled_plan(spec, sets: tuple[str, ...], tree: Path) -> dict | None:
    """The tree's plan.json when the tree was compiled from this spec with exactly
    `sets`; None when it was not, or when plan.json is not one msgen wrote."""
    record = compiled_record(tree)
    if record is None or record.spec_sha256 != spec.sha256 or record.sets != sets:
        return None
    path = tree / PLAN
    try:
        if not path.is_file() or path.stat().st_size > PLAN_CAP:
            return None
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None
