"""Windows to a MindRecord file with MindSpore's own FileWriter: the format train.py's
`MindDataset` reads (mindspore/mindrecord/filewriter.py)."""

from __future__ import annotations

from pathlib import Path

from msgen.data import DataError

COLUMN = "input_ids"
SCHEMA = {COLUMN: {"type": "int32", "shape": [-1]}}
MINDRECORD_EXTRA = "pip install 'msgen[mindrecord]'"


def import_file_writer():
    """FileWriter, imported only when `msgen data` runs (never by `import msgen`)."""
    try:
        from mindspore.mindrecord import FileWriter
    except ImportError as exc:
        raise DataError(f"writing MindRecord needs MindSpore ({exc})", MINDRECORD_EXTRA) from None
    return FileWriter


class WindowWriter:
    """One MindRecord file (and the `.db` index FileWriter puts beside it)."""

    def __init__(self, path: Path):
        self.writer = import_file_writer()(str(path), shard_num=1)
        self.writer.add_schema(SCHEMA, "msgen data: seq + 1 token ids per sample")

    def write(self, windows) -> None:
        if len(windows):
            self.writer.write_raw_data([{COLUMN: row} for row in windows])

    def commit(self) -> None:
        self.writer.commit()
