"""One rank's `log.csv`, read as a stream: a row at a time through csv.reader over
the open file, each line cut at LINE_LIMIT characters, into one table of doubles of
the columns the report reads (8 bytes a value and a byte saying whether the row has
one). A log of a million rows costs some 100 MB whatever its text, and no line,
however long, is held whole.

A partial log is read as far as it goes, and each gap is a note: a last row cut
short (no line end after it), a malformed row (a field count other than the
header's, a value that is no number, a step outside 0..MAX_STEP), a line over the
limit, a line the csv module refuses (a quoted field running over lines past the
limit; named with its line number). A step that
repeats or goes back (a run restarted without cutting its log back) keeps the later
rows: the earlier rows from that step on are dropped. Each kind of note is said for
the first NOTES_PER_KIND lines, then counted.
"""

from __future__ import annotations

import csv
import errno
import os
import stat
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

from msgen.diagnostics import printable

# The columns of train.py's LOG_FIELDS the report reads; the others (perplexities,
# aux_loss) are skipped, not stored.
COLUMNS = (
    "loss",
    "lr",
    "grad_norm",
    "loss_scale",
    "skipped",
    "tokens_per_s",
    "step_time",
    "mfu",
    "valid_loss",
    "peak_memory_bytes",
)
LINE_LIMIT = 16 * 1024  # characters in a line; train.py's rows are about 200
MAX_STEP = 2**53  # a step is an exact float up to here (the plots' x axis)
NOTES_PER_KIND = 5
NAN = float("nan")
AFTERWORD = {
    "malformed": "malformed (ignored)",
    "too long": "too long (ignored)",
    "refused": "the csv module refuses (ignored)",
    "repeated": "repeating an earlier step (the later rows kept)",
}


@dataclass
class Table:
    """The columns of a log, row after row: each row's value of each column (NaN where
    the row has none) and whether it has one ("" is no value; "nan" is a value, what
    the alarms look for). A row is appended, and rows are cut from the end, whole."""

    names: tuple[str, ...] = ()
    values: array = field(default_factory=lambda: array("d"))
    present: bytearray = field(default_factory=bytearray)

    def get(self, name: str, i: int) -> float | None:
        j = i * len(self.names) + self.names.index(name)
        return self.values[j] if self.present[j] else None

    def numbers(self, name: str, start: int = 0) -> array:
        """The column's value at each row from row `start` on, NaN where a row has none
        (for readers of finite values alone), as a copy: 8 bytes a row, read at C speed."""
        j, width = self.names.index(name), len(self.names)
        return self.values[start * width + j :: width]

    def column(self, name: str, start: int = 0) -> Iterator[float | None]:
        """The column's value at each row from row `start` on (None where it has none)."""
        width = len(self.names)
        j = start * width + self.names.index(name)
        # a strided copy (C, 9 bytes a row) is read faster than every value skipped
        here = zip(self.values[j::width], self.present[j::width])
        return (v if p else None for v, p in here)

    def cut(self, rows: int) -> None:
        del self.values[rows * len(self.names) :]
        del self.present[rows * len(self.names) :]


@dataclass
class Log:
    """What one log.csv holds: every kept row's step (increasing) and the columns."""

    steps: array = field(default_factory=lambda: array("q"))
    table: Table = field(default_factory=Table)
    notes: list[str] = field(default_factory=list)


class NotALog(ValueError):
    """The file is no log.csv train.py wrote (no header with a `step` column)."""


class _Notes:
    """The notes of one log, each kind said NOTES_PER_KIND times and then counted."""

    def __init__(self, where: str):
        self.where, self.said, self.more = where, Counter(), Counter()
        self.lines: list[str] = []

    def add(self, kind: str, text: str) -> None:
        if self.said[kind] < NOTES_PER_KIND:
            self.said[kind] += 1
            self.lines.append(f"{self.where}: {text}")
        else:
            self.more[kind] += 1

    def done(self) -> list[str]:
        return self.lines + [
            f"{self.where}: {n} more line{'s' if n > 1 else ''} {AFTERWORD[kind]}"
            for kind, n in self.more.items()
        ]


def _lines(f, notes: _Notes, too_long: set[int]):
    """The file's lines, each at most LINE_LIMIT characters: a longer one is read
    through in pieces and stands as an empty line (its number in `too_long`); a last
    line without its line end is left out and said."""
    number = 0
    while True:
        line = f.readline(LINE_LIMIT + 1)
        if not line:
            return
        number += 1
        if len(line) > LINE_LIMIT:
            while line and not line.endswith(("\n", "\r")):
                line = f.readline(LINE_LIMIT)
            too_long.add(number)
            yield "\n"
        elif line.endswith(("\n", "\r")):
            yield line
        else:
            notes.add("cut short", "the last row is cut short (ignored)")
            return


def open_regular(path: Path):
    """`path` opened for reading text, only if it is a regular file (a FIFO is never
    waited on, a device never read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return os.fdopen(fd, "r", encoding="utf-8", errors="replace", newline="")
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def field_limit(limit: int):
    """The csv module's field limit set to `limit` while a log is read, then put back:
    a quoted field running over many lines stops at it whatever the process had set
    (importing MindSpore sets 10 MiB)."""
    previous = csv.field_size_limit(limit)
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def read_log(path: Path, where: str) -> Log:
    """The rows of the log.csv at `path` and notes (each starting with `where`) on what
    was left out. NotALog when it has no header with a `step` column; OSError when it
    cannot be read."""
    notes, too_long = _Notes(where), set()
    log = Log()
    with open_regular(path) as f, field_limit(LINE_LIMIT):
        reader = csv.reader(_lines(f, notes, too_long))
        rows = _rows(reader, notes)
        header = next(rows, None)
        if not header or "step" not in header:
            raise NotALog("no header with a `step` column")
        width, at_step = len(header), header.index("step")
        names = tuple(name for name in COLUMNS if name in header)
        log.table = table = Table(names)
        fetch = itemgetter(at_step, *(header.index(name) for name in names))
        picked = fetch if names else lambda fields: (fetch(fields),)
        steps, values, present = log.steps, table.values, table.present
        for fields in rows:
            if too_long and reader.line_num in too_long:
                notes.add("too long", f"line {reader.line_num} is longer than {LINE_LIMIT} "
                          "characters (ignored)")  # fmt: skip
                continue
            try:
                if len(fields) != width:
                    raise ValueError
                step, *texts = picked(fields)
                step = int(step)
                if not 0 <= step <= MAX_STEP:
                    raise ValueError
                parsed = [float(text) if text else NAN for text in texts]
            except ValueError:
                notes.add("malformed", f"line {reader.line_num} is malformed (ignored)")
                continue
            if steps and step <= steps[-1]:
                notes.add("repeated", f"line {reader.line_num} repeats step {step} "
                          "(the later row kept)")  # fmt: skip
                keep = bisect_left(steps, step)
                del steps[keep:]
                table.cut(keep)
            steps.append(step)
            values.extend(parsed)
            present.extend(map(bool, texts))
    log.notes = notes.done()
    return log


def _rows(reader, notes: _Notes) -> Iterator[list[str]]:
    """The reader's rows; a row the csv module refuses is said and skipped."""
    while True:
        before = reader.line_num
        try:
            yield from reader
            return
        except csv.Error as exc:
            notes.add("refused", f"line {reader.line_num}: {printable(str(exc))} (ignored)")
            if reader.line_num == before:  # nothing consumed: nothing more to read
                return
