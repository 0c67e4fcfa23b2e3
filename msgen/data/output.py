"""All or nothing into the output folder: a dataset is built in a hidden staging
folder inside it and moved into place (renamed, never copied) only when complete,
dataset.json last.

A file is msgen's only if a previous dataset.json in the folder records it: only
those are ever replaced (with `force`) or removed; any other file in the way is
refused. One run at a time writes a folder (a lock on the folder, which the kernel
drops when the process dies); under the lock, staging folders that runs killed on
the way left behind are removed, unless --resume continues the one they left. An
error, Ctrl-C, SIGTERM or SIGHUP leaves the staging folder for --resume when units
are done in it, and removes it (and the folders this run created, if empty) otherwise.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path

from msgen.base.files import interrupts_deferred, read_regular
from msgen.data import DataError
from msgen.data.sources import shown

MANIFEST = "dataset.json"
FORMAT = "msgen-data 1"
SETS = ("train", "valid")
STAGING_PREFIX = ".msgen-data-"
PARTIAL = f"{STAGING_PREFIX}partial"  # the staging folder, which --resume continues
COMMITTING = "committing.json"  # in the staging folder: the names its commit moves
MANIFEST_LIMIT = 1 << 28  # a manifest names every unit's files
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what ends a run, cleanly


def recorded(folder: Path) -> set[str]:
    """The files a previous dataset.json in `folder` says msgen data wrote (itself
    included); empty when there is none, or it is not one msgen wrote."""
    try:
        manifest = json.loads(read_regular(folder / MANIFEST, MANIFEST_LIMIT))
    except (OSError, ValueError, RecursionError):
        return set()
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return set()
    files = manifest.get("files")
    names = {MANIFEST}
    for listed in files.values() if isinstance(files, dict) else ():
        # a list of unit files; a single name in datasets of msgen before units
        for name in listed if isinstance(listed, list) else [listed]:
            if isinstance(name, str) and is_data_file(name):
                names |= {name, f"{name}.db"}
    tokenizer = manifest.get("tokenizer")
    if isinstance(tokenizer, dict) and tokenizer.get("trained") is True:
        if tokenizer.get("path") == "tokenizer.json":
            names.add("tokenizer.json")
    return names


def is_data_file(name: str) -> bool:
    """A name msgen data gives a MindRecord file: `train.mindrecord`,
    `valid-00012.mindrecord` (never a path)."""
    stem, _, number = name.removesuffix(".mindrecord").partition("-")
    return (
        name.endswith(".mindrecord")
        and stem in SETS
        and (number == "" or number.isdigit())
        and "/" not in name
    )


def disk_full(path) -> DataError:
    return DataError(f"disk full writing {shown(path)}", "free some space, or choose -o elsewhere")


def os_error(exc: OSError, doing: str) -> DataError:
    """An OSError as one line that names the path it is about (no room: "disk full")."""
    if exc.errno == errno.ENOSPC and exc.filename:
        return disk_full(exc.filename)
    where = f" {shown(exc.filename)}" if exc.filename else ""
    return DataError(f"cannot {doing}{where}: {exc.strerror or exc}")


def moving(stage: Path) -> set[str]:
    """The names a commit in the staging folder `stage` moves into the output folder
    (COMMITTING, written before its first rename): what a commit cut short may have
    moved already, dataset.json among them."""
    try:
        names = json.loads((stage / COMMITTING).read_text("utf-8"))
    except (OSError, ValueError):
        return set()
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


class Staging:
    """`with Staging(folder, names, force, keep) as stage:` build files in `stage.path`,
    then `stage.commit()`. `keep` is a file the run reads (its --tokenizer), never
    removed even where a previous dataset recorded it."""

    def __init__(
        self,
        folder: Path,
        names: list[str],
        force: bool,
        keep: Path | None = None,
        resume: bool = False,
    ):
        self.folder, self.names, self.force, self.keep = folder, names, force, keep
        self.resume = resume
        self.path: Path | None = None
        self.lock: int | None = None
        self.created: list[Path] = []
        self.check()

    def check(self) -> None:
        folder = self.folder
        if os.path.lexists(folder) and not folder.is_dir():
            raise DataError(f"{shown(folder)} is not a folder", "-o names a folder")
        self.owned = recorded(folder) if folder.is_dir() else set()
        # a commit cut short moved some of the partial run's files already
        moved = moving(folder / PARTIAL) if self.resume else set()
        in_way = [n for n in self.names if os.path.lexists(folder / n) and n not in moved]
        foreign = [n for n in in_way if n not in self.owned]
        if foreign:
            raise DataError(
                f"{shown(folder / foreign[0])} is in the way: no dataset.json of msgen data "
                "there records it, so msgen will not replace it (--force neither)",
                "move it away, or choose another folder with -o",
            )
        if in_way and not self.force:
            raise DataError(
                f"{shown(folder)} already holds a dataset ({', '.join(in_way)})",
                "pass --force to replace it, or choose another folder with -o",
            )

    def __enter__(self):
        missing = []
        for parent in [self.folder, *self.folder.parents]:
            if os.path.lexists(parent):
                break
            missing.append(parent)
        try:
            for folder in reversed(missing):
                try:
                    folder.mkdir()
                except FileExistsError:  # another run made it just now: not ours
                    if not folder.is_dir():
                        raise
                    continue
                self.created.insert(0, folder)
            self.lock = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            self.__exit__()
            raise os_error(exc, "make the output folder") from None
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.__exit__()
            raise DataError(
                f"another msgen data run is writing to {shown(self.folder)}",
                "wait for it to end, or choose another folder with -o",
            ) from None
        try:
            self.check()  # again, under the lock: a run that just ended may have written
            partial = self.folder / PARTIAL
            for stale in self.folder.glob(f"{STAGING_PREFIX}*"):
                if stale.is_dir() and not stale.is_symlink():
                    if not (self.resume and stale == partial):
                        shutil.rmtree(stale, ignore_errors=True)
            (partial / "units").mkdir(parents=True, exist_ok=True)
            self.path = partial
        except OSError as exc:
            self.__exit__()
            raise os_error(exc, "write in") from None
        except BaseException:
            self.__exit__()
            raise
        return self

    def units_done(self) -> int:
        """Units whose records the staging folder holds: what --resume would skip."""
        return len(list((self.path / "units").glob("*.json"))) if self.path else 0

    def discard(self) -> None:
        """A complete pass whose dataset is refused (MSL602, no document): nothing to
        resume from."""
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None

    def __exit__(self, *exc) -> None:
        if self.path is not None and self.path.exists() and not self.units_done():
            shutil.rmtree(self.path, ignore_errors=True)
        if self.lock is not None:
            os.close(self.lock)  # and with it the lock
            self.lock = None
        for folder in self.created:  # deepest first
            try:
                folder.rmdir()
            except OSError:  # not empty: a dataset was committed, or another file came
                break

    def commit(self, names: list[str]) -> None:
        """Move the dataset's files `names` (dataset.json among them) into the
        folder, dataset.json last, with Ctrl-C, SIGTERM and SIGHUP held back until
        done; remove the files of the dataset replaced that this one does not write
        (and this run does not read). A name not in the staging folder is already in
        place: a commit cut short moved it."""
        keep = self.keep.resolve() if self.keep else None
        with interrupts_deferred(STOPS):
            # What is moved is recorded first: a run killed while moving (SIGKILL) is
            # resumed over the files it moved, its dataset.json among them.
            plan = self.path / f"{COMMITTING}.tmp"
            plan.write_text(json.dumps(sorted(names)), "utf-8")
            os.replace(plan, self.path / COMMITTING)
            # The folder stops being a dataset first, and becomes one again last.
            (self.folder / MANIFEST).unlink(missing_ok=True)
            for name in sorted(self.owned - set(names)):
                old = self.folder / name
                if os.path.lexists(old) and not old.is_dir() and old.resolve() != keep:
                    old.unlink()
            for name in sorted(names, key=lambda n: n == MANIFEST):
                if os.path.lexists(self.path / name) or name == MANIFEST:
                    os.replace(self.path / name, self.folder / name)
            shutil.rmtree(self.path)
            self.path = None
            self.created = []  # they hold the dataset now


@contextmanager
def stops_interrupt():
    """SIGTERM and SIGHUP end the run as Ctrl-C does (KeyboardInterrupt), so the
    staging folder is removed on the way out instead of left behind."""

    def interrupt(*_):
        raise KeyboardInterrupt

    try:
        previous = {s: signal.signal(s, interrupt) for s in STOPS[1:]}
    except ValueError:  # not the main thread: signals go elsewhere anyway
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
