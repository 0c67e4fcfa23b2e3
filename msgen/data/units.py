"""Work units: the corpus cut into pieces a worker tokenizes and packs on its own.

A unit is a whole file, a byte range of a large JSON Lines file, or a run of row
groups of a large Parquet file. Units depend only on the inputs and the unit size,
never on the workers, so every engine and every worker count packs the same
windows. A byte range holds the lines that start inside it (the line a range's
start falls into belongs to the range before). Plain text (a document per file, or
blocks between blank lines) and `.gz` files (which cannot be entered in the middle)
are one unit each.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from msgen.data import DataError
from msgen.data.readers import CHUNK, Document, Skipped, read_jsonl, read_parquet
from msgen.data.sources import Source, open_regular, parquet_file

UNIT_SIZE = 64 << 20  # bytes of input a unit holds at most (a row group may exceed it)
SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """`64M`, `512k`, `1G` or a byte count; at least 1 KiB."""
    text = text.strip().lower()
    scale = SUFFIXES.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    if not number.isdigit() or int(number) * scale < 1 << 10:
        raise DataError(f"--unit-size {text}: a size such as 64M (at least 1K)")
    return int(number) * scale


@dataclass(frozen=True)
class Unit:
    index: int  # its place in the dataset: the files it writes are numbered by it
    source: Source
    start: int = 0  # byte range [start, end) of a JSON Lines file; end 0: to the end
    end: int = 0
    groups: tuple[int, ...] = ()  # Parquet row groups; empty: all of them
    first_row: int = 0  # rows of the Parquet file before the first group

    @property
    def size(self) -> int:
        """Bytes of input the unit covers, for the progress line."""
        if self.end:
            return self.end - self.start
        return self.source.size

    def key(self) -> str:
        """What the unit is: the source (with its size and modification time) and its
        part; a unit done with the same key and options need not be done again."""
        st = os.stat(self.source.path)
        what = asdict(self)
        what["source"] = {**asdict(self.source), "path": str(self.source.path)}
        what["mtime_ns"] = st.st_mtime_ns
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    def __str__(self) -> str:
        from msgen.data.sources import shown

        name = shown(self.source.path)
        if self.end:
            return f"{name} (bytes {self.start:,} to {self.end:,})"
        if self.groups:
            return f"{name} (row groups {self.groups[0]} to {self.groups[-1]})"
        return name


def is_gz(source: Source) -> bool:
    return source.path.suffix.lower() == ".gz"


def plan(srcs: list[Source], unit_size: int) -> list[Unit]:
    """The units of the inputs, in the inputs' order."""
    parts: list[dict] = []
    for source in srcs:
        if source.kind == "jsonl" and not is_gz(source) and source.size > unit_size:
            for start in range(0, source.size, unit_size):
                parts.append(
                    dict(source=source, start=start, end=min(start + unit_size, source.size))
                )
        elif source.kind == "parquet":
            parts += parquet_parts(source, unit_size)
        else:
            parts.append(dict(source=source))
    return [Unit(i, **part) for i, part in enumerate(parts)]


def parquet_parts(source: Source, unit_size: int) -> list[dict]:
    meta = parquet_file(source).metadata
    parts, groups, size, row, first = [], [], 0, 0, 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        groups.append(g)
        size += group.total_byte_size  # uncompressed: what reading it costs
        row += group.num_rows
        if size >= unit_size:
            parts.append(dict(source=source, groups=tuple(groups), first_row=first))
            groups, size, first = [], 0, row
    if groups or not parts:
        parts.append(dict(source=source, groups=tuple(groups), first_row=first))
    return parts if len(parts) > 1 else [dict(source=source)]


def read_unit(unit: Unit) -> Iterator[Document | Skipped]:
    """The documents of `unit`; a file that cannot be read on is a DataError."""
    from msgen.data.readers import Cursor, read

    source = unit.source
    if source.kind == "parquet" and unit.groups:
        yield from read_parquet(source, Cursor(), unit.groups, unit.first_row)
    elif unit.end:
        with open_regular(source.path) as f:
            yield from read_range(source, f, unit.start, unit.end)
    else:
        yield from read(source, Cursor())


def read_range(source: Source, f, start: int, end: int) -> Iterator[Document | Skipped]:
    """The lines of a JSON Lines file that start in [start, end)."""
    if start:
        f.seek(start - 1)
        while (piece := f.readline(CHUNK)) and not piece.endswith(b"\n"):
            pass  # the rest of the line that started before the range
    yield from read_jsonl(source, Bounded(f, end), first_line=None if start else 1)


class Bounded:
    """A file whose lines end at the first line starting at or after `end`."""

    def __init__(self, f, end: int):
        self.f, self.end = f, end

    def readline(self, limit: int = -1) -> bytes:
        if self.f.tell() >= self.end:
            return b""
        return self.f.readline(limit)

    def tell(self) -> int:
        return self.f.tell()
