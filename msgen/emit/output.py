"""Put an emitted tree on disk, or compare it with what is there.

msgen owns only `<out>/<model>/`: a file there is msgen's if the previous
manifest lists it or it bears the generated header. Anything else is never
overwritten without `force`, and nothing outside the folder is touched.
"""

from __future__ import annotations

import difflib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from msgen.emit import MANIFEST

HEADER_MARK = "@generated spec-sha256="


@dataclass
class Change:
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


class NotOurs(Exception):
    """Files in the output folder that msgen did not write."""

    def __init__(self, paths: list[str]):
        super().__init__(", ".join(paths))
        self.paths = paths


def previous_files(folder: Path) -> set[str]:
    try:
        doc = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        return set(doc.get("files", {}))
    except (OSError, ValueError, AttributeError):
        return set()


def bears_header(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            head = [f.readline() for _ in range(3)]
    except OSError:
        return False
    return any(HEADER_MARK in line for line in head)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        if path.suffix == ".sh":
            os.chmod(tmp, 0o755)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_tree(folder: Path, files: dict[str, str], force: bool = False) -> Change:
    """Write `files` under `folder`; remove what the previous manifest listed that is
    no longer generated. Refuses (NotOurs) before writing anything if a file to be
    replaced is not msgen's, unless `force`."""
    previous = previous_files(folder)
    foreign = [
        rel
        for rel in files
        if (folder / rel).exists() and rel not in previous and not bears_header(folder / rel)
    ]
    if foreign and not force:
        raise NotOurs(sorted(foreign))
    change = Change()
    for rel, text in files.items():
        path = folder / rel
        if path.is_file() and path.read_text(encoding="utf-8", errors="replace") == text:
            change.unchanged.append(rel)
            continue
        _atomic_write(path, text)
        change.written.append(rel)
    for rel in sorted(previous - set(files)):
        path = (folder / rel).resolve()
        # only ever inside our own folder, whatever the old manifest says
        if folder.resolve() in path.parents and path.is_file():
            path.unlink()
            change.removed.append(rel)
    for rel in change.removed:
        parent = (folder / rel).parent
        while parent != folder and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    return change


def _comparable(rel: str, text: str) -> str:
    """--check ignores the msgen version recorded in the manifest."""
    if rel != MANIFEST:
        return text
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    doc.pop("msgen_version", None)
    return json.dumps(doc, indent=2)


def diff_tree(folder: Path, files: dict[str, str], label: str) -> str:
    """A unified diff from what is on disk to what would be written ('' if none)."""
    chunks = []
    on_disk = previous_files(folder)
    for rel in sorted(set(files) | (on_disk - set(files))):
        path = folder / rel
        old = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None
        new = files.get(rel)
        if old is not None and new is not None and _comparable(rel, old) == _comparable(rel, new):
            continue
        if old is None and new is None:
            continue
        chunks.extend(
            difflib.unified_diff(
                (old or "").splitlines(keepends=True),
                (new or "").splitlines(keepends=True),
                fromfile=f"a/{label}/{rel}" if old is not None else "/dev/null",
                tofile=f"b/{label}/{rel}" if new is not None else "/dev/null",
            )
        )
    return "".join(chunks)
