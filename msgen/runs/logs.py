"""A run folder as train.py leaves it: `rank_<r>/log.csv` (a row per step, written
and flushed whole; the columns are train.py's LOG_FIELDS) and `rank_<r>/run.json`
(the provenance, a segment per start: a resumed run appends one).

A partial run is read as far as it goes, and every gap becomes a note: a last row
cut short (no newline after it, or too few fields), a malformed row, ranks that
stopped at different steps, a rank without run.json or without log.csv.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from msgen.runs import RunError

RANK_FOLDER = re.compile(r"rank_(\d+)")


@dataclass(frozen=True)
class RankLog:
    rank: int
    rows: tuple[dict[str, float | None], ...]  # by column; `step` an int; "" is None
    segments: tuple[dict, ...]  # run.json's segments, oldest first; () without one

    @property
    def last_step(self) -> int:
        return int(self.rows[-1]["step"]) if self.rows else 0

    def series(self, column: str) -> list[tuple[int, float]]:
        """(step, value) of the rows that have a value in `column`."""
        return [(int(r["step"]), r[column]) for r in self.rows if r.get(column) is not None]

    @property
    def provenance(self) -> dict | None:
        """The newest segment of run.json: what this rank runs now."""
        return self.segments[-1] if self.segments else None


@dataclass(frozen=True)
class Run:
    folder: Path
    ranks: tuple[RankLog, ...]  # by rank
    notes: tuple[str, ...]  # what is missing or cut short, in words

    @property
    def world(self) -> int:
        """The processes of the run: run.json's `world`, else the rank folders found."""
        worlds = [r.provenance.get("world") for r in self.ranks if r.provenance]
        known = [w for w in worlds if isinstance(w, int) and w > 0]
        return max(known) if known else max(r.rank for r in self.ranks) + 1

    def rank(self, rank: int) -> RankLog | None:
        return next((r for r in self.ranks if r.rank == rank), None)


def number(text: str) -> float | None:
    """A CSV field: "" is None; "nan" and "inf" are kept (they are what the alarms look for)."""
    return None if text == "" else float(text)


def read_log(text: str, where: str) -> tuple[list[dict[str, float | None]], list[str]]:
    """The rows of one log.csv and notes on what was dropped."""
    notes = []
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines.pop()
        notes.append(f"{where}: the last row is cut short (ignored)")
    table = list(csv.reader(io.StringIO("".join(lines))))
    if not table or "step" not in table[0]:
        raise ValueError("no header with a `step` column")
    header, rows = table[0], []
    for i, fields in enumerate(table[1:], start=2):
        try:
            if len(fields) != len(header):
                raise ValueError
            row = {k: number(v) for k, v in zip(header, fields)}
            row["step"] = int(fields[header.index("step")])
        except ValueError:
            notes.append(f"{where}: line {i} is malformed (ignored)")
            continue
        if rows and row["step"] <= rows[-1]["step"]:
            notes.append(f"{where}: line {i} repeats step {row['step']} (the later row kept)")
            rows = [r for r in rows if r["step"] < row["step"]]
        rows.append(row)
    return rows, notes


def read_segments(path: Path, where: str) -> tuple[tuple[dict, ...], list[str]]:
    if not path.is_file():
        return (), [f"{where}: no run.json (its versions cannot be checked)"]
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        segments = doc["segments"]
        if not isinstance(segments, list) or not all(isinstance(s, dict) for s in segments):
            raise TypeError
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return (), [f"{where}: run.json is not readable (ignored)"]
    return tuple(segments), []


def read_run(folder: Path) -> Run:
    """Every rank folder of `folder`; RunError when there is no log to read."""
    if not folder.is_dir():
        raise RunError(f"{folder}: no such folder (train.py's --output, such as output/)")
    found = sorted(
        (int(m.group(1)), p)
        for p in folder.iterdir()
        if p.is_dir() and (m := RANK_FOLDER.fullmatch(p.name))
    )
    ranks, notes = [], []
    for rank, path in found:
        where = f"rank {rank}"
        segments, more = read_segments(path / "run.json", where)
        log = path / "log.csv"
        if not log.is_file():
            notes.append(f"{where}: no log.csv yet")
            continue
        try:
            rows, more_log = read_log(log.read_text(encoding="utf-8", errors="replace"), where)
        except (OSError, ValueError) as exc:
            notes.append(f"{where}: log.csv is not train.py's log ({exc}; ignored)")
            continue
        notes += more + more_log
        ranks.append(RankLog(rank, tuple(rows), segments))
    if not ranks:
        raise RunError(f"{folder} holds no rank_*/log.csv (is it train.py's --output folder?)")
    run = Run(folder, tuple(ranks), ())
    return Run(folder, run.ranks, tuple(notes + coverage_notes(run)))


def coverage_notes(run: Run) -> list[str]:
    """Ranks the run should have and does not, and ranks at different steps."""
    notes = []
    absent = sorted(set(range(run.world)) - {r.rank for r in run.ranks})
    if absent:
        notes.append(f"no log from rank{'s' if len(absent) > 1 else ''} {spans(absent)}")
    last = {r.rank: r.last_step for r in run.ranks}
    if len(set(last.values())) > 1:
        notes.append(
            "ranks stopped at different steps: "
            + ", ".join(f"rank {r} at {s}" for r, s in last.items())
        )
    return notes


def spans(numbers: list[int]) -> str:
    """`0-3, 6` for [0, 1, 2, 3, 6]."""
    out, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(out)


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
