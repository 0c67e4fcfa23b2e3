"""Put an emitted tree on disk, or compare it with what is there.

msgen owns only `<out>/<model>/`: a file there is msgen's if the previous
manifest lists it or it bears the generated header. Anything else is never
overwritten without `force`, and nothing outside the folder is touched.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from msgen.base.files import STAGED, interrupts_deferred, new_file_mode, stage

MANIFEST = "manifest.json"  # every compiled tree's record of itself (it lists itself)

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


class InTheWay(Exception):
    """A path in the output folder msgen will not write through or over: a symbolic
    link, or a folder where a file goes (or a file where a folder goes)."""

    def __init__(self, rel: str, why: str):
        super().__init__(f"{rel} {why}")
        self.rel, self.why = rel, why


class DamagedManifest(Exception):
    """manifest.json is there but is not a manifest msgen wrote."""


class EditedByHand(Exception):
    """Generated files whose bytes no longer match the hash the manifest recorded."""

    def __init__(self, paths: list[str]):
        super().__init__(", ".join(paths))
        self.paths = paths


class OtherSpec(Exception):
    """The folder holds the tree of another spec with the same model name."""

    def __init__(self, previous: str, new: str):
        super().__init__(f"compiled from {previous}, not {new}")
        self.previous, self.new = previous, new


BACKUP = ".msgen-old"  # the old file while the new tree is switched in


def _listed_path(rel: object) -> bool:
    """A path a manifest may list: relative, inside the folder, plain."""
    if not isinstance(rel, str) or not rel or "\0" in rel or "\\" in rel:
        return False
    parts = PurePosixPath(rel).parts
    return not PurePosixPath(rel).is_absolute() and ".." not in parts and "." not in rel.split("/")


def previous_manifest(folder: Path, force: bool = False) -> dict:
    """The previous manifest ({} when there is none). A manifest that is not msgen's
    is DamagedManifest, unless `force`: then it is ignored."""
    path = folder / MANIFEST
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        files = doc["files"]
        if not isinstance(files, dict) or not all(map(_listed_path, files)):
            raise TypeError
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        if force:
            return {}
        raise DamagedManifest(f"{MANIFEST} is damaged (not a manifest msgen wrote)") from None
    return doc


@dataclass(frozen=True)
class Record:
    """What a compiled tree's manifest says of how it was compiled."""

    spec_sha256: str | None
    sets: tuple[str, ...]  # its --set flags (a tree from before they were recorded: none)


def compiled_record(folder: Path) -> Record | None:
    """The record of the tree in `folder`; None when it holds no manifest msgen wrote."""
    try:
        doc = previous_manifest(folder)
    except DamagedManifest:
        return None
    sets = doc.get("set", [])
    if not doc or not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
        return None
    sha = doc.get("spec_sha256")
    return Record(sha if isinstance(sha, str) else None, tuple(sets))


def previous_files(folder: Path, force: bool = False) -> set[str]:
    """What the previous manifest lists (nothing when there is none)."""
    return set(previous_manifest(folder, force).get("files", {}))


def edited_by_hand(folder: Path, listed: dict, files: dict[str, str]) -> list[str]:
    """The files the manifest hashed whose bytes differ from that hash, among those
    this run would overwrite (with other text) or remove."""
    edited = []
    for rel, recorded in sorted(listed.items()):
        path = folder / rel
        if not isinstance(recorded, str) or not path.is_file():
            continue
        data = path.read_bytes()
        if rel in files and data == files[rel].encode():
            continue  # nothing of the edit would be lost
        if hashlib.sha256(data).hexdigest() != recorded:
            edited.append(rel)
    return edited


def bears_header(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            head = [f.readline() for _ in range(3)]
    except OSError:
        return False
    return any(HEADER_MARK in line for line in head)


def in_the_way(folder: Path, rels) -> InTheWay | None:
    """The first of `rels` that cannot be written or removed without following a
    link or replacing a folder; checked before anything is written."""
    if folder.is_symlink():
        return InTheWay(".", "is a symbolic link (msgen never writes through one)")
    if folder.exists() and not folder.is_dir():
        return InTheWay(".", "is not a folder")
    for rel in rels:
        path, parts = folder, PurePosixPath(rel).parts
        for depth, part in enumerate(parts, 1):
            path = path / part
            shown = "/".join(parts[:depth])
            if path.is_symlink():
                return InTheWay(shown, "is a symbolic link (msgen never writes through one)")
            if not path.exists():
                break
            if depth == len(parts) and not path.is_file():
                return InTheWay(shown, "is in the way: a file goes there")
            if depth < len(parts) and not path.is_dir():
                return InTheWay(shown, "is in the way: a folder goes there")
    return None


def _real_folder(folder: Path, rel: PurePosixPath) -> bool:
    """Whether `folder/rel` is a folder reached without following any link."""
    paths = [folder]
    for part in rel.parts:
        paths.append(paths[-1] / part)
    return all(path.is_dir() and not path.is_symlink() for path in paths)


def _recover(folder: Path, rels) -> None:
    """Undo what a run that was killed while switching left behind: its staged
    files go, and the old files it had set aside come back. Only in folders of the
    tree itself: a manifest may list a path through a link out of it."""
    for parent in sorted({PurePosixPath(rel).parent for rel in rels}):
        where = folder / parent
        if not _real_folder(folder, parent):
            continue
        for entry in where.iterdir():
            name = entry.name
            if name.startswith(".") and name.endswith(STAGED):
                entry.unlink(missing_ok=True)
            elif name.startswith(".") and name.endswith(BACKUP):
                os.replace(entry, where / name[1 : -len(BACKUP)])


def _make_folders(folder: Path, parent: Path) -> list[Path]:
    """Create `parent` (inside or equal to `folder`) and what it needs; the folders
    made, outermost first."""
    made = []
    for path in reversed([parent, *parent.parents]):
        if not path.exists():
            path.mkdir()
            made.append(path)
    return made


def _switch(folder: Path, staged: dict[str, Path], removed: list[str]) -> None:
    """Move the staged files into place and the removed ones out, all or none: each
    old file is set aside first, and put back if a rename fails."""
    done: list[tuple[Path, Path | None]] = []
    try:
        for rel in removed:
            target = folder / rel
            backup = target.with_name(f".{target.name}{BACKUP}")
            os.replace(target, backup)
            done.append((target, backup))
        for rel, tmp in staged.items():
            target = folder / rel
            backup = None
            if target.exists():
                backup = target.with_name(f".{target.name}{BACKUP}")
                os.replace(target, backup)
            done.append((target, backup))
            os.replace(tmp, target)
    except BaseException:
        for target, backup in reversed(done):
            if backup is None:
                target.unlink(missing_ok=True)
            else:
                os.replace(backup, target)
        raise
    for _, backup in done:
        if backup is not None:
            backup.unlink()


def write_tree(folder: Path, files: dict[str, str], force: bool = False) -> Change:
    """Write `files` under `folder`; remove what the previous manifest listed that is
    no longer generated. Before anything is written it refuses a damaged manifest
    (DamagedManifest), links and folders in the way (InTheWay) and, unless `force`,
    files msgen did not write (NotOurs). The new files are staged beside the old
    ones and switched in together, so a failure or Ctrl-C at any point leaves the
    old tree or the new one; what msgen does not own in the folder stays. Unless
    `force`, it also refuses a folder another spec was compiled into (OtherSpec)
    and generated files edited by hand (EditedByHand)."""
    blocked = in_the_way(folder, files)
    if blocked:
        raise blocked
    _recover(folder, set(files) | previous_files(folder, force=True))
    manifest = previous_manifest(folder, force)
    previous = set(manifest.get("files", {}))
    spec = json.loads(files[MANIFEST])["spec"] if MANIFEST in files else None
    if not force and manifest and spec is not None and manifest.get("spec") != spec:
        raise OtherSpec(str(manifest.get("spec")), spec)
    edited = edited_by_hand(folder, manifest.get("files", {}), files)
    if edited and not force:
        raise EditedByHand(edited)
    removed = sorted(rel for rel in previous - set(files))
    blocked = in_the_way(folder, removed)
    if blocked:
        raise blocked
    removed = [rel for rel in removed if (folder / rel).is_file()]
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
        else:
            change.written.append(rel)
    made: list[Path] = []
    staged: dict[str, Path] = {}
    try:
        for rel in change.written:
            path = folder / rel
            made += _make_folders(folder, path.parent)
            staged[rel] = stage(path, files[rel], new_file_mode(executable=rel.endswith(".sh")))
        with interrupts_deferred():
            _switch(folder, staged, removed)
    except BaseException:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
        for path in reversed(made):
            path.rmdir()
        raise
    change.removed = removed
    for rel in removed:
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
    except (ValueError, RecursionError):  # a manifest nested past the parser's depth
        return text
    if not isinstance(doc, dict):
        return text
    doc.pop("msgen_version", None)
    return json.dumps(doc, indent=2)


def diff_tree(folder: Path, files: dict[str, str], label: str) -> str:
    """A unified diff from what is on disk to what would be written ('' if none)."""
    chunks = []
    on_disk = previous_files(folder, force=True)  # a damaged one shows in the diff
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
