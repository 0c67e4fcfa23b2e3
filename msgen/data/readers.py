"""Documents from one input file, in memory bounded by MAX_DOCUMENT whatever the file.

A reader yields a `Document` per document, or a `Skipped` record saying where and
why (invalid UTF-8 with its byte offset, a line that is not JSON, a record without
the field, a record longer than MAX_DOCUMENT), so one bad document never ends a
run. A file that cannot be read on (a truncated or corrupt `.gz`, a bad Parquet
page, a read error) ends it with one line naming the file and the offset.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from msgen.data import DataError
from msgen.data.sources import Source, open_regular, parquet_file, shown

MAX_DOCUMENT = 16 << 20  # bytes: longer text is cut at a line break, longer records skipped
CHUNK = 1 << 20  # bytes read at once from a line that may be long
PARQUET_BATCH = 64  # rows per Parquet read: memory follows this, not the file
MAX_RATIO = 200  # a .gz that inflates more than this is not a corpus (text: 3 to 10)
RATIO_GRACE = 16 << 20  # decompressed bytes before the ratio is checked
BOM = b"\xef\xbb\xbf"
INVALID_UTF8 = "invalid UTF-8"
TOO_LONG = f"longer than {MAX_DOCUMENT >> 20} MiB"


@dataclass(frozen=True)
class Where:
    """Where a document starts: the file, and its line, Parquet row or byte offset
    (offsets in a `.gz` are in the decompressed text)."""

    file: Path
    line: int | None = None
    row: int | None = None
    byte: int | None = None

    def at_byte(self, byte: int) -> Where:
        return Where(self.file, self.line, self.row, byte)

    def __str__(self) -> str:
        text = shown(self.file)
        if self.line is not None:
            text += f":{self.line}"
        if self.row is not None:
            text += f": row {self.row}"
        if self.byte is not None:
            text += f": byte {self.byte}"
        return text


@dataclass(frozen=True)
class Document:
    text: str
    where: Where
    cut: bool = False  # a piece of a longer text, cut at MAX_DOCUMENT


@dataclass(frozen=True)
class Skipped:
    where: Where
    reason: str  # a short phrase; the counts in dataset.json are keyed by it
    keys: tuple[str, ...] = ()  # a JSON record without the field: the keys it has


@dataclass
class Cursor:
    """How far the reading is: bytes of the files finished, and of the current one
    (compressed bytes for a `.gz`), for the progress line and error messages."""

    done: int = 0
    raw: object = None  # the current file as opened from disk
    parquet: tuple[int, int, int] | None = None  # (row, rows, size) of a Parquet file

    def position(self) -> int:
        if self.parquet is not None:
            row, rows, size = self.parquet
            return self.done + (size * row // rows if rows else 0)
        try:
            return self.done + (self.raw.tell() if self.raw is not None else 0)
        except (OSError, ValueError):
            return self.done


class Inflated:
    """A `.gz` read through, refusing to inflate more than MAX_RATIO times what it
    read from disk (memory is bounded anyway; this bounds the time a bomb takes)."""

    def __init__(self, raw, path: Path):
        self.raw, self.path = raw, path
        self.gz = gzip.GzipFile(fileobj=raw, mode="rb")
        self.out = 0

    def _count(self, data: bytes) -> bytes:
        self.out += len(data)
        if self.out > RATIO_GRACE and self.out > MAX_RATIO * max(self.raw.tell(), 1):
            raise DataError(
                f"{shown(self.path)} inflates more than {MAX_RATIO} times its size "
                f"(at byte {self.out:,} of its text): not a text corpus",
                "text compresses 3 to 10 times; unpack it and look at it",
            )
        return data

    def readline(self, limit: int = -1) -> bytes:
        return self._count(self.gz.readline(limit))

    def read(self, n: int = -1) -> bytes:
        return self._count(self.gz.read(n))


def read(source: Source, cursor: Cursor) -> Iterator[Document | Skipped]:
    """The documents of `source`; a file that cannot be read on is a DataError."""
    if source.kind == "parquet":
        yield from read_parquet(source, cursor)
        return
    with open_regular(source.path) as raw:
        cursor.raw = raw
        f = Inflated(raw, source.path) if source.path.suffix.lower() == ".gz" else raw
        reader = read_jsonl(source, f) if source.kind == "jsonl" else read_text(source, f)
        try:
            yield from reader
        except (OSError, EOFError, zlib.error) as exc:
            # gzip: EOFError when truncated, BadGzipFile (an OSError) for a bad header
            # or CRC, zlib.error for corrupt data; OSError for a failing disk
            what = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise DataError(
                f"cannot read {shown(source.path)} past byte {raw.tell():,}: {what}",
                "the file is damaged or truncated; fix or remove it",
            ) from None
    cursor.raw, cursor.done = None, cursor.done + source.size


def decode(data: bytes, where: Where, offset: int, cut: bool = False) -> Document | Skipped:
    try:
        return Document(data.decode("utf-8"), where, cut)
    except UnicodeDecodeError as exc:
        return Skipped(where.at_byte(offset + exc.start), INVALID_UTF8)


def complete_utf8(data: bytes) -> int:
    """The length of `data` without a UTF-8 sequence its end cuts in two."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the lead byte of the last sequence (or ASCII)
            need = 2 if byte >> 5 == 6 else 3 if byte >> 4 == 14 else 4 if byte >> 3 == 30 else 1
            return len(data) - back if need > back else len(data)
    return len(data)


def read_text(source: Source, f) -> Iterator[Document | Skipped]:
    """A document per file, or per block of lines between blank lines with
    --paragraphs; a document longer than MAX_DOCUMENT is cut at a line break (or,
    in a longer line, at a character) into documents of at most that size."""
    block, size, start, offset, number = [], 0, (1, 0), 0, 0
    ended = True  # the piece before ended its line
    cut = False  # the block is the rest of a text cut before

    def where() -> Where:
        whole = not source.paragraphs and not cut
        return Where(source.path) if whole else Where(source.path, start[0])

    while piece := f.readline(CHUNK):
        if number == 0 and piece.startswith(BOM):
            piece, offset = piece[len(BOM) :], len(BOM)
        number += ended
        complete = piece.endswith(b"\n")
        if source.paragraphs and ended and complete and not piece.strip():
            if block:
                yield decode(b"".join(block), where(), start[1], cut)
            block, size, cut = [], 0, False
            offset += len(piece)
            continue
        if not block:
            start = (number, offset)
        block.append(piece)
        size += len(piece)
        offset += len(piece)
        ended = complete
        while size > MAX_DOCUMENT:
            data = b"".join(block)
            at = data.rfind(b"\n", 0, MAX_DOCUMENT) + 1 or complete_utf8(data[:MAX_DOCUMENT])
            cut = True
            yield decode(data[:at], where(), start[1], cut)
            rest = data[at:]
            block, size = [rest], len(rest)
            # the rest ends where this piece ends, on line `number`
            start = (number - rest.count(b"\n", 0, max(len(rest) - 1, 0)), offset - size)
    if block or (not source.paragraphs and number == 0):
        yield decode(b"".join(block), where(), start[1], cut)


def skip_line(f) -> None:
    """Read on to the end of a line too long to keep, holding a chunk at a time."""
    while (piece := f.readline(CHUNK)) and not piece.endswith(b"\n"):
        pass


def read_jsonl(source: Source, f, first_line: int | None = 1) -> Iterator[Document | Skipped]:
    """The records of `f` from where it stands; lines are numbered from `first_line`,
    or, where the count is not known (a range that starts inside the file), a record
    is placed by its byte offset."""
    offset = f.tell() if first_line is None else 0
    number = (first_line or 1) - 1
    while line := f.readline(MAX_DOCUMENT + 1):
        number += 1
        where = Where(source.path, number) if first_line else Where(source.path, byte=offset)
        start, offset = offset, offset + len(line)
        if len(line) > MAX_DOCUMENT and not line.endswith(b"\n"):
            skip_line(f)
            yield Skipped(where, TOO_LONG)
            continue
        if first_line and number == 1 and line.startswith(BOM):
            line, start = line[len(BOM) :], start + len(BOM)
        if not line.strip():
            continue
        doc = decode(line, where, start)
        if isinstance(doc, Skipped):
            yield doc
            continue
        try:
            record = json.loads(doc.text)
        except (ValueError, RecursionError):  # RecursionError: nested past the stack
            yield Skipped(where, "not JSON")
            continue
        text = record.get(source.field) if isinstance(record, dict) else None
        if isinstance(text, str):
            yield Document(text, where)
        else:
            keys = tuple(record) if isinstance(record, dict) else ()
            yield Skipped(where, f"no string field `{source.field}`", keys)


def read_parquet(
    source: Source, cursor: Cursor, groups: tuple[int, ...] = (), first_row: int = 0
) -> Iterator[Document | Skipped]:
    """The rows of `source`, or of its row `groups` (the first of which is row
    `first_row` + 1 of the file)."""
    import pyarrow as pa

    file = parquet_file(source)
    rows, row = file.metadata.num_rows, first_row
    chosen = {"row_groups": list(groups)} if groups else {}
    batches = file.iter_batches(batch_size=PARQUET_BATCH, columns=[source.field], **chosen)
    while True:
        cursor.parquet = (row, rows, source.size)
        try:
            batch = next(batches, None)
            if batch is None:
                break
            column = batch.column(0)
            # as bytes, so that a value of invalid UTF-8 is one document skipped
            if pa.types.is_string(column.type):
                column = column.cast(pa.binary())
            elif pa.types.is_large_string(column.type):
                column = column.cast(pa.large_binary())
            values = column.to_pylist()
        except Exception as exc:  # pyarrow's own errors for a corrupt page
            raise DataError(
                f"cannot read {shown(source.path)} as Parquet after row {row:,}: {exc}"
            ) from None
        for value in values:
            row += 1
            where = Where(source.path, row=row)
            if isinstance(value, bytes) and len(value) > MAX_DOCUMENT:
                yield Skipped(where, TOO_LONG)
            elif isinstance(value, bytes):
                yield decode(value, where, 0)
            else:
                yield Skipped(where, f"no string field `{source.field}`")
    cursor.parquet, cursor.done = None, cursor.done + source.size
