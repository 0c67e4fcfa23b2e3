"""All or nothing into the output folder: a dataset is built in a hidden staging
folder inside it and moved into place only when complete, dataset.json last.

A file is msgen's only if a previous dataset.json in the folder records it: only
those are ever replaced (with `force`) or removed; any other file in the way is
refused. One run at a time writes a folder (a lock on the folder, which the kernel
drops when the process dies); under the lock, staging folders that runs killed on
the way left behind are removed. An error, Ctrl-C, SIGTERM or SIGHUP removes the
staging folder, and the folders this run created if they are empty.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

from msgen.base.files import interrupts_deferred, read_regular
from msgen.data import DataError
from msgen.data.sources import shown

MANIFEST = "dataset.json"
FORMAT = "msgen-data 1"
SETS = ("train", "valid")
STAGING_PREFIX = ".msgen-data-"
MANIFEST_LIMIT = 1 << 20
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
    for name in files.values() if isinstance(files, dict) else ():
        if name in (f"{s}.mindrecord" for s in SETS):
            names |= {name, f"{name}.db"}
    tokenizer = manifest.get("tokenizer")
    if isinstance(tokenizer, dict) and tokenizer.get("trained") is True:
        if tokenizer.get("path") == "tokenizer.json":
            names.add("tokenizer.json")
    return names


def disk_full(path) -> DataError:
    return DataError(f"disk full writing {shown(path)}", "free some space, or choose -o elsewhere")


def os_error(exc: OSError, doing: str) -> DataError:
    """An OSError as one line that names the path it is about (no room: "disk full")."""
    if exc.errno == errno.ENOSPC and exc.filename:
        return disk_full(exc.filename)
    where = f" {shown(exc.filename)}" if exc.filename else ""
    return DataError(f"cannot {doing}{where}: {exc.strerror or exc}")


class Staging:
    """`with Staging(folder, names, force, keep) as stage:` build files in `stage.path`,
    then `stage.commit()`. `keep` is a file the run reads (its --tokenizer), never
    removed even where a previous dataset recorded it."""

    def __init__(self, folder: Path, names: list[str], force: bool, keep: Path | None = None):
        self.folder, self.names, self.force, self.keep = folder, names, force, keep
        self.path: Path | None = None
        self.lock: int | None = None
        self.created: list[Path] = []
        self.check()

    def check(self) -> None:
        folder = self.folder
        if os.path.lexists(folder) and not folder.is_dir():
            raise DataError(f"{shown(folder)} is not a folder", "-o names a folder")
        self.owned = recorded(folder) if folder.is_dir() else set()
        in_way = [n for n in self.names if os.path.lexists(folder / n)]
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
            for stale in self.folder.glob(f"{STAGING_PREFIX}*"):
                if stale.is_dir() and not stale.is_symlink():
                    shutil.rmtree(stale, ignore_errors=True)
            prefix = f"{STAGING_PREFIX}{os.getpid()}-"
            self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=self.folder))
        except OSError as exc:
            self.__exit__()
            raise os_error(exc, "write in") from None
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.path is not None and self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)
        if self.lock is not None:
            os.close(self.lock)  # and with it the lock
            self.lock = None
        for folder in self.created:  # deepest first
            try:
                folder.rmdir()
            except OSError:  # not empty: a dataset was committed, or another file came
                break

    def commit(self) -> None:
        """Move the staged files into the folder, dataset.json last, with Ctrl-C,
        SIGTERM and SIGHUP held back until done; remove the files of the dataset
        replaced that this one does not write (and this run does not read)."""
        keep = self.keep.resolve() if self.keep else None
        with interrupts_deferred(STOPS):
            # The folder stops being a dataset first, and becomes one again last.
            (self.folder / MANIFEST).unlink(missing_ok=True)
            for name in sorted(self.owned - set(self.names)):
                old = self.folder / name
                if os.path.lexists(old) and not old.is_dir() and old.resolve() != keep:
                    old.unlink()
            for name in sorted(self.names, key=lambda n: n == MANIFEST):
                os.replace(self.path / name, self.folder / name)
            self.path.rmdir()
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
