"""A run folder as train.py leaves it: `rank_<r>/log.csv` (a row per step, written
and flushed whole; the columns are train.py's LOG_FIELDS) and `rank_<r>/run.json`
(the provenance, a segment per start: a resumed run appends one).

A partial run is read as far as it goes, and every gap becomes a note: a last row
cut short (no newline after it, or too few fields), a malformed row, ranks that
stopped at different steps, a rank without run.json or without log.csv
(msgen.runs.csvlog reads a log). A run.json that is there but is not what train.py
writes (it writes it whole, staged and renamed) is refused, naming the file and the
key: the run's world, spec and versions come from it.

A rank number, from a folder's name or run.json's `world`, is counted, never listed:
the ranks a run lacks are computed from the gaps between those it has.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from msgen.base.readers import Dict, Int, List, Nullable, Obj, Str, load_json
from msgen.diagnostics import printable
from msgen.runs import RunError
from msgen.runs.csvlog import MAX_STEP, NotALog, Table, read_log

MAX_RANKS = 2**31  # rank ids are 32-bit; any count up to here costs nothing
RANK_FOLDER = re.compile(r"rank_(0|[1-9][0-9]{0,9})")  # as train.py names them
RUN_JSON_LIMIT = 16 * 2**20  # a segment per start is a few KiB
MOST_SPANS = 20  # a list of ranks or steps in a note names this many spans, then counts

# run.json as train.py writes it (templates/train/provenance.py.j2): the keys the
# report reads are checked; others (argv, env, mesh, ...) are carried as they are.
SEGMENT = Obj(
    optional={
        "started": Str(64),
        "start_step": Int(0, MAX_STEP),
        "rank": Int(0, MAX_RANKS - 1),
        "world": Int(1, MAX_RANKS),
        "host": Str(),
        "spec": Obj(
            optional={
                "name": Nullable(Str()),
                "path": Nullable(Str()),
                "sha256": Nullable(Str(128)),
            }
        ),
        "manifest_sha256": Nullable(Str(128)),
        "tokens_per_step": Int(1, MAX_STEP),
        "versions": Dict(Nullable(Str(256))),
    }
)
RUN_JSON = Obj(required={"segments": List(SEGMENT)})


@dataclass(frozen=True)
class RankLog:
    rank: int
    steps: object  # array('q'): every kept row's step, increasing
    table: Table  # the columns of msgen.runs.csvlog.COLUMNS the log has
    segments: int = 0  # the starts run.json records (0: no run.json)
    provenance: dict | None = None  # run.json's newest segment: what the rank runs now

    @property
    def rows(self) -> int:
        return len(self.steps)

    @property
    def last_step(self) -> int:
        return self.steps[-1] if self.steps else 0

    def value(self, column: str, i: int) -> float | None:
        return self.table.get(column, i) if column in self.table.names else None

    def values(self, column: str, start: int = 0) -> Iterator[float | None]:
        """The column's value at each row from row `start` on (None where it has none)."""
        if column not in self.table.names:
            return (None for _ in islice(self.steps, start, None))
        return self.table.column(column, start)

    def numbers(self, column: str, start: int = 0) -> array:
        """The column's value at each row from row `start` on, NaN where a row has none:
        for readers of its finite values (filter(math.isfinite, ...) at C speed)."""
        if column not in self.table.names:
            return array("d", [math.nan]) * max(0, self.rows - start)
        return self.table.numbers(column, start)

    def series(self, column: str, start: int = 0) -> Iterator[tuple[int, float]]:
        """(step, value) of the rows from row `start` on that have a value in `column`."""
        rows = zip(islice(self.steps, start, None), self.values(column, start))
        return ((s, v) for s, v in rows if v is not None)


@dataclass(frozen=True)
class Run:
    folder: Path
    ranks: tuple[RankLog, ...]  # by rank
    notes: tuple[str, ...]  # what is missing or cut short, in words

    @property
    def world(self) -> int:
        """The processes of the run: run.json's `world`, else the rank folders found."""
        known = [r.provenance["world"] for r in self.ranks if "world" in (r.provenance or {})]
        return max(known) if known else max(r.rank for r in self.ranks) + 1

    def rank(self, rank: int) -> RankLog | None:
        return next((r for r in self.ranks if r.rank == rank), None)


def read_provenance(path: Path) -> tuple[int, dict | None]:
    """run.json's number of segments and its newest; (0, None) without the file.
    BadInput (a usage error naming the file and the key) when it is not train.py's."""
    if not path.exists() and not path.is_symlink():
        return 0, None
    segments = load_json(path, RUN_JSON_LIMIT, RUN_JSON)["segments"]
    return len(segments), (segments[-1] if segments else None)


def read_run(folder: Path) -> Run:
    """Every rank folder of `folder`; RunError when there is no log to read."""
    name = printable(str(folder))
    if not folder.is_dir():
        raise RunError(f"{name}: no such folder (train.py's --output, such as output/)")
    found = sorted(
        (int(m.group(1)), p)
        for p in folder.iterdir()
        if (m := RANK_FOLDER.fullmatch(p.name)) and int(m.group(1)) < MAX_RANKS and p.is_dir()
    )
    ranks, notes = [], []
    for rank, path in found:
        where = f"rank {rank}"
        segments, provenance = read_provenance(path / "run.json")
        if not segments:
            notes.append(f"{where}: no run.json (its versions cannot be checked)")
        try:
            log = read_log(path / "log.csv", where)
        except FileNotFoundError:
            notes.append(f"{where}: no log.csv yet")
            continue
        except (OSError, NotALog) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            notes.append(f"{where}: log.csv is not train.py's log ({why}; ignored)")
            continue
        notes += log.notes
        ranks.append(RankLog(rank, log.steps, log.table, segments, provenance))
    if not ranks:
        raise RunError(f"{name} holds no rank_*/log.csv (is it train.py's --output folder?)")
    run = Run(folder, tuple(ranks), ())
    return Run(folder, run.ranks, tuple(notes + coverage_notes(run)))


def coverage_notes(run: Run) -> list[str]:
    """Ranks the run should have and does not, and ranks at different steps."""
    notes = []
    world = run.world
    had = sorted({r.rank for r in run.ranks if r.rank < world})
    gaps, after = [], 0
    for rank in [*had, world]:
        if rank > after:
            gaps.append((after, rank - 1))
        after = rank + 1
    absent = world - len(had)
    if absent:
        notes.append(f"no log from rank{'s' if absent > 1 else ''} {ranges(gaps)}")
    at: dict[int, list[int]] = {}
    for r in run.ranks:
        at.setdefault(r.last_step, []).append(r.rank)
    if len(at) > 1:
        groups = sorted(at.items(), key=lambda kv: kv[1][0])
        said = [f"rank{'s' if len(rs) > 1 else ''} {spans(rs)} at {step}"
                for step, rs in groups[:MOST_SPANS]]  # fmt: skip
        more = f", and {len(groups) - MOST_SPANS} more steps" if len(groups) > MOST_SPANS else ""
        notes.append("ranks stopped at different steps: " + ", ".join(said) + more)
    return notes


def ranges(pairs: list[tuple[int, int]]) -> str:
    """`0-3, 6` for [(0, 3), (6, 6)]; after MOST_SPANS of them, how many more ranks."""
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in pairs[:MOST_SPANS])
    rest = sum(b - a + 1 for a, b in pairs[MOST_SPANS:])
    return text + (f", and {rest} more" if rest else "")


def spans(numbers: list[int]) -> str:
    """`0-3, 6` for [0, 1, 2, 3, 6] (increasing)."""
    pairs: list[tuple[int, int]] = []
    for n in numbers:
        if pairs and n == pairs[-1][1] + 1:
            pairs[-1] = (pairs[-1][0], n)
        else:
            pairs.append((n, n))
    return ranges(pairs)


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
