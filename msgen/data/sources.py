"""Documents from the input files: plain text, JSON Lines and Parquet, chosen by the
file's extension; `.gz` is read directly.

A reader yields a `Document` per document, or a `Skipped` record saying where and
why (invalid UTF-8 with its byte offset, a line that is not JSON, a record without
the field), so one bad document never ends a run.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from msgen.data import DataError

KINDS = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
}
PARQUET_EXTRA = "pip install 'msgen[parquet]'"
PARQUET_BATCH = 1024  # rows per Parquet read: memory follows this, not the file


@dataclass(frozen=True)
class Document:
    text: str
    where: str  # file, or file:line, for messages


@dataclass(frozen=True)
class Skipped:
    where: str
    reason: str  # a short phrase; the counts in dataset.json are keyed by it


@dataclass(frozen=True)
class Source:
    path: Path
    kind: str  # text | jsonl | parquet
    field: str = "text"  # the JSON Lines / Parquet field holding the text
    paragraphs: bool = False  # plain text: a document per blank-line-separated block


INVALID_UTF8 = "invalid UTF-8"


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


def sources(paths: list[Path], field: str, paragraphs: bool) -> list[Source]:
    """Check every input before any work: it exists and its kind is known (and, for
    Parquet, pyarrow is there and the file has the field)."""
    found = []
    for path in expand(paths):
        if not path.is_file():
            raise DataError(f"no such input file: {path}")
        kind = kind_of(path)
        if kind is None:
            raise DataError(
                f"cannot tell what kind of file {path} is",
                f"inputs end in {', '.join(KINDS)} (text and JSON Lines may add .gz)",
            )
        source = Source(path, kind, field, paragraphs)
        if kind == "parquet":
            parquet_columns(source)
        found.append(source)
    if not found:
        raise DataError("no input files", "name text, JSON Lines or Parquet files, or folders")
    return found


def read(source: Source) -> Iterator[Document | Skipped]:
    if source.kind == "jsonl":
        return read_jsonl(source)
    if source.kind == "parquet":
        return read_parquet(source)
    if source.paragraphs:
        return read_paragraphs(source)
    return read_whole(source)


def open_binary(path: Path):
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else path.open("rb")


def decode(data: bytes, where: str, offset: int) -> Document | Skipped:
    try:
        return Document(data.decode("utf-8"), where)
    except UnicodeDecodeError as exc:
        return Skipped(f"{where}: byte {offset + exc.start}", INVALID_UTF8)


def read_whole(source: Source) -> Iterator[Document | Skipped]:
    """The whole file is one document."""
    with open_binary(source.path) as f:
        yield decode(f.read(), str(source.path), 0)


def read_paragraphs(source: Source) -> Iterator[Document | Skipped]:
    """A document per block of lines between blank lines."""
    block: list[bytes] = []
    start_line = start_offset = offset = 0
    with open_binary(source.path) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                if not block:
                    start_line, start_offset = number, offset
                block.append(line)
            elif block:
                yield decode(b"".join(block), f"{source.path}:{start_line}", start_offset)
                block = []
            offset += len(line)
    if block:
        yield decode(b"".join(block), f"{source.path}:{start_line}", start_offset)


def read_jsonl(source: Source) -> Iterator[Document | Skipped]:
    offset = 0
    with open_binary(source.path) as f:
        for number, line in enumerate(f, 1):
            where = f"{source.path}:{number}"
            start, offset = offset, offset + len(line)
            if not line.strip():
                continue
            doc = decode(line, where, start)
            if isinstance(doc, Skipped):
                yield doc
                continue
            try:
                record = json.loads(doc.text)
            except ValueError:
                yield Skipped(where, "not JSON")
                continue
            text = record.get(source.field) if isinstance(record, dict) else None
            if isinstance(text, str):
                yield Document(text, where)
            else:
                yield Skipped(where, f"no string field `{source.field}`")


def import_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DataError(f"reading Parquet needs pyarrow ({exc})", PARQUET_EXTRA) from None
    return pq


def parquet_columns(source: Source) -> list[str]:
    pq = import_parquet()
    try:
        names = pq.ParquetFile(source.path).schema_arrow.names
    except Exception as exc:  # pyarrow raises its own error types for a bad file
        raise DataError(f"cannot read {source.path} as Parquet: {exc}") from None
    if source.field not in names:
        raise DataError(
            f"{source.path} has no column `{source.field}`",
            f"its columns: {', '.join(names)}; choose one with --field",
        )
    return names


def read_parquet(source: Source) -> Iterator[Document | Skipped]:
    pq = import_parquet()
    row = 0
    for batch in pq.ParquetFile(source.path).iter_batches(
        batch_size=PARQUET_BATCH, columns=[source.field]
    ):
        for text in batch.column(0).to_pylist():
            row += 1
            where = f"{source.path}: row {row}"
            if isinstance(text, str):
                yield Document(text, where)
            elif isinstance(text, bytes):  # a binary column: its bytes may not be UTF-8
                yield decode(text, where, 0)
            else:
                yield Skipped(where, f"no string field `{source.field}`")
