"""Windows to a MindRecord file with MindSpore's own FileWriter: the format train.py's
`MindDataset` reads (mindspore/mindrecord/filewriter.py)."""

from __future__ import annotations

import errno
from contextlib import contextmanager
from pathlib import Path

from msgen.data import DataError
from msgen.data.output import disk_full
from msgen.data.sources import shown

COLUMN = "input_ids"
# FileWriter's defaults (a 16 MiB header, 32 MiB pages) make every file at least 48 MiB
# long (sparse, but read whole by a digest); a unit's file holds a few pages, whose
# list fits a header of 1 MiB, and its writer buffers one page of 8 MiB.
HEADER_SIZE = 1 << 20
PAGE_SIZE = 8 << 20
SCHEMA = {COLUMN: {"type": "int32", "shape": [-1]}}
MINDRECORD_EXTRA = "pip install 'msgen[mindrecord]'"
# What MindSpore's writer says when statvfs finds no room (shard_writer.cc).
NO_ROOM = "No free disk"


def import_file_writer():
    """FileWriter, imported only when `msgen data` runs (never by `import msgen`)."""
    try:
        from mindspore.mindrecord import FileWriter
    except ImportError as exc:
        raise DataError(f"writing MindRecord needs MindSpore ({exc})", MINDRECORD_EXTRA) from None
    return FileWriter


@contextmanager
def writing(path: Path):
    """MindSpore's writer errors (a RuntimeError holding a framework report of many
    lines, or one of mindrecord's own exceptions) and OSErrors as one line naming
    the file; no room on the disk as "disk full"."""
    from mindspore.mindrecord.common.exceptions import MindRecordException

    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise disk_full(path) from None
        raise DataError(f"cannot write {shown(path)}: {exc.strerror or exc}") from None
    except (RuntimeError, MindRecordException) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = next((line for line in lines if line.startswith("[ERROR]")), None)
        reason = (reason or (lines[0] if lines else type(exc).__name__)).removeprefix("[ERROR] ")
        if NO_ROOM in reason:
            raise disk_full(path) from None
        raise DataError(f"cannot write {shown(path)}: {reason}") from None


class WindowWriter:
    """One MindRecord file (and the `.db` index FileWriter puts beside it)."""

    def __init__(self, path: Path, final: Path):
        self.path = final  # what messages name: where the file goes, not where it is staged
        with writing(final):
            self.writer = import_file_writer()(str(path), shard_num=1)
            self.writer.set_header_size(HEADER_SIZE)
            self.writer.set_page_size(PAGE_SIZE)
            self.writer.add_schema(SCHEMA, "msgen data: seq + 1 token ids per sample")

    def write(self, windows) -> None:
        if len(windows):
            with writing(self.path):
                self.writer.write_raw_data([{COLUMN: row} for row in windows])

    def commit(self) -> None:
        with writing(self.path):
            self.writer.commit()
