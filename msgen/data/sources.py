"""The inputs of `msgen data`: which files, of which kind, checked before any work.

Plain text, JSON Lines and Parquet, chosen by the file's extension; `.gz` is read
directly. Only regular files are read (a FIFO is never waited on, a device never
read from); msgen.data.readers turns each into documents.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from msgen.data import DataError
from msgen.diagnostics import printable

KINDS = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
}
PARQUET_EXTRA = "pip install 'msgen[parquet]'"


def shown(path: Path | str) -> str:
    """A file name as messages print it: terminal escapes and line breaks escaped, so
    a hostile name can neither colour the terminal nor forge a line of output."""
    return printable(str(path))


@dataclass(frozen=True)
class Source:
    path: Path
    kind: str  # text | jsonl | parquet
    field: str = "text"  # the JSON Lines / Parquet field holding the text
    paragraphs: bool = False  # plain text: a document per blank-line-separated block
    size: int = 0  # bytes on disk, for the progress line


def kind_of(path: Path) -> str | None:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
        if suffixes and suffixes[-1] == ".parquet":
            return None  # Parquet compresses inside the file
    return KINDS.get(suffixes[-1]) if suffixes else None


def expand(paths: list[Path]) -> list[Path]:
    """Files as given; a folder stands for the files under it with a known kind, sorted."""
    files = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and kind_of(p))
        else:
            files.append(path)
    return files


def open_regular(path: Path):
    """`path` opened for reading in binary, if it is a regular file (checked on the open
    file, so a name swapped for a FIFO after the checks is not waited on either)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise DataError(f"cannot read {shown(path)}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise not_regular(path)
    return os.fdopen(fd, "rb")


def not_regular(path: Path) -> DataError:
    return DataError(
        f"{shown(path)} is not a regular file",
        "msgen data reads files: a FIFO, a device or a socket is not read",
    )


def sources(paths: list[Path], field: str, paragraphs: bool) -> list[Source]:
    """Check every input before any work: it exists, is a regular file and its kind is
    known (and, for Parquet, pyarrow is there and the file has the field)."""
    found = []
    for path in expand(paths):
        if not os.path.lexists(path):
            raise DataError(f"no such input file: {shown(path)}")
        if not path.exists():
            raise DataError(f"no such input file: {shown(path)} (a link to nothing)")
        if not path.is_file():
            raise not_regular(path)
        kind = kind_of(path)
        if kind is None:
            raise DataError(
                f"cannot tell what kind of file {shown(path)} is",
                f"inputs end in {', '.join(KINDS)} (text and JSON Lines may add .gz)",
            )
        source = Source(path, kind, field, paragraphs, path.stat().st_size)
        if kind == "parquet":
            parquet_columns(source)
        found.append(source)
    if not found:
        raise DataError("no input files", "name text, JSON Lines or Parquet files, or folders")
    return found


def import_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DataError(f"reading Parquet needs pyarrow ({exc})", PARQUET_EXTRA) from None
    return pq


def parquet_file(source: Source):
    pq = import_parquet()
    try:
        return pq.ParquetFile(open_regular(source.path))
    except DataError:
        raise
    except Exception as exc:  # pyarrow raises its own error types for a bad file
        raise DataError(f"cannot read {shown(source.path)} as Parquet: {exc}") from None


def parquet_columns(source: Source) -> list[str]:
    names = parquet_file(source).schema_arrow.names
    if source.field not in names:
        raise DataError(
            f"{shown(source.path)} has no column `{source.field}`",
            f"its columns: {', '.join(names)}; choose one with --field",
        )
    return names
