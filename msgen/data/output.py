"""All or nothing into the output folder: a dataset is built in a hidden staging
folder inside it and moved into place only when complete, dataset.json last.

An existing dataset is replaced only with `force`, and only the files a dataset
consists of are ever removed; an error or Ctrl-C removes the staging folder alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from msgen.commands.files import interrupts_deferred
from msgen.data import DataError

MANIFEST = "dataset.json"
# Every file `msgen data` may write (FileWriter puts an index `.db` beside each file).
DATASET_FILES = (
    "train.mindrecord",
    "train.mindrecord.db",
    "valid.mindrecord",
    "valid.mindrecord.db",
    "tokenizer.json",
    MANIFEST,
)
STAGING_PREFIX = ".msgen-data-"


class Staging:
    """`with Staging(folder, names, force, keep) as stage:` build files in `stage.path`,
    then `stage.commit()`. Leaving the block without a commit removes the staging
    folder (and the output folder, if this run created it and it is empty)."""

    def __init__(self, folder: Path, names: list[str], force: bool, keep: Path | None = None):
        self.folder, self.names, self.keep = folder, names, keep
        if folder.exists() and not folder.is_dir():
            raise DataError(f"{folder} is not a folder")
        present = [
            n for n in DATASET_FILES if (folder / n).exists() and (n in names or n == MANIFEST)
        ]
        if present and not force:
            raise DataError(
                f"{folder} already holds a dataset ({', '.join(present)})",
                "pass --force to replace it, or choose another folder with -o",
            )
        self.created = not folder.exists()
        self.path: Path | None = None

    def __enter__(self):
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.folder))
        return self

    def __exit__(self, *exc) -> None:
        if self.path is not None and self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)
        if self.created and self.folder.is_dir() and not any(self.folder.iterdir()):
            self.folder.rmdir()

    def commit(self) -> None:
        """Move the staged files into the folder, dataset.json last, with Ctrl-C held
        back until done; remove the old dataset's files this one does not replace."""
        with interrupts_deferred():
            # The folder stops being a dataset first, and becomes one again last.
            (self.folder / MANIFEST).unlink(missing_ok=True)
            keep = self.keep.resolve() if self.keep else None
            for name in DATASET_FILES:
                old = self.folder / name
                if name not in self.names and old.is_file() and old.resolve() != keep:
                    old.unlink()
            for name in sorted(self.names, key=lambda n: n == MANIFEST):
                os.replace(self.path / name, self.folder / name)
            self.path.rmdir()
