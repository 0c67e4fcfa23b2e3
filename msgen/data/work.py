"""One work unit's job, the same whichever engine runs it: read the unit's documents,
normalise, drop the duplicates the plan names, split, tokenize, pack and write the
unit's own MindRecord files; record what was done for --resume.

The unit's stream of each set is packed on its own: windows never span two units,
and the tokens after a unit's last whole window are dropped (counted). So a unit's
files depend on the unit alone, whichever worker writes them and when.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from msgen.data import DataError
from msgen.data.counts import Counts, SetCounts
from msgen.data.normalize import FORMS, normalize
from msgen.data.readers import INVALID_UTF8, Skipped, Where
from msgen.data.units import Unit, read_unit

BATCH_BYTES = 1 << 20  # text handed to the tokenizer at once
PIECE = 1 << 18  # characters of one document handed to the tokenizer at most at once
TRAIN, VALID = "train", "valid"
RECORDS = "units"  # the folder of unit records inside the staging folder


@dataclass(frozen=True)
class Job:
    """What every unit of a run shares (sent to each worker once)."""

    stage: Path  # where the files are written
    outputs: tuple[str, ...]  # train, and valid with --valid
    seq: int
    overlap: int
    normalize: str
    valid: float | None
    eos_id: int = 0
    tokenizer_sha: str = ""


@dataclass
class UnitResult:
    index: int
    counts: Counts
    sets: dict[str, SetCounts]
    files: dict[str, str] = field(default_factory=dict)  # written file: its sha256

    def record(self, key: str) -> dict:
        return {
            "key": key,
            "counts": self.counts.record(),
            "sets": {n: vars(s) for n, s in self.sets.items()},
            "files": self.files,
        }

    @classmethod
    def from_record(cls, index: int, record: dict) -> UnitResult:
        return cls(
            index,
            Counts.from_record(record["counts"]),
            {n: SetCounts(**s) for n, s in record["sets"].items()},
            record["files"],
        )


def file_name(name: str, index: int) -> str:
    return f"{name}-{index:05d}.mindrecord"


def in_valid(digest: bytes, fraction: float | None) -> bool:
    """A document's side of the split, from its content hash: the same for the same
    text whatever the input order, so a duplicate never lands on both sides."""
    return fraction is not None and int.from_bytes(digest[:8], "big") < fraction * 2**64


def digest_of(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def documents(
    unit: Unit, job: Job, counts: Counts, drop: frozenset[int] = frozenset()
) -> Iterator[tuple[str, str, bytes, Where]]:
    """(set, normalised text, its hash, where) of every document of the unit kept, in
    order; `drop`: the ordinals (among documents with text) of duplicates to drop."""
    form = FORMS[job.normalize]
    ordinal = -1
    for item in read_unit(unit):
        if isinstance(item, Skipped):
            counts.skip(item)
            continue
        text, changed = normalize(item.text, form)
        try:
            digest = digest_of(text)
        except UnicodeEncodeError:  # a lone surrogate, from a JSON `\ud800` escape
            counts.skip(Skipped(item.where, INVALID_UTF8))
            continue
        if not text.strip():
            counts.skip(Skipped(item.where, "empty"), False)
            continue
        ordinal += 1
        counts.documents += 1
        counts.cut_documents += item.cut
        counts.normalized_documents += changed > 0
        counts.normalized_characters += changed
        if ordinal in drop:
            counts.duplicates += 1
            continue
        yield (VALID if in_valid(digest, job.valid) else TRAIN), text, digest, item.where


def pieces(text: str) -> Iterator[str]:
    """`text` in pieces of at most PIECE characters, cut after a line break (or a
    space) in each piece's second half where there is one: the tokenizer's memory
    follows the piece, and its pre-tokenizer breaks at those characters anyway."""
    start = 0
    while len(text) - start > PIECE:
        end = start + PIECE
        cut = text.rfind("\n", start + PIECE // 2, end)
        cut = cut if cut >= 0 else text.rfind(" ", start + PIECE // 2, end)
        cut = end if cut < 0 else cut + 1
        yield text[start:cut]
        start = cut
    yield text[start:]


class Output:
    """One set's MindRecord file of one unit: its packer, and its writer, made when
    the first window is complete (a unit whose set holds no window writes no file)."""

    def __init__(self, name: str, unit: Unit, job: Job, tokenizer):
        from msgen.data.pack import Packer

        self.counts = SetCounts(name, job.seq + 1)
        self.file = file_name(name, unit.index)
        self.path = job.stage / self.file
        self.packer = Packer(job.seq + 1, job.overlap)
        self.tokenizer, self.eos = tokenizer, job.eos_id
        self.writer = None
        self.texts: list[str] = []  # pieces waiting for the tokenizer
        self.ends: list[bool] = []  # whether each ends its document
        self.pending_bytes = 0
        self.first: Where | None = None  # where the waiting text starts

    def add(self, text: str, where: Where) -> int:
        """Queue a document; tokenize when a batch is full. Returns the tokens packed."""
        self.counts.documents += 1
        tokens = 0
        for piece in pieces(text):
            self.first = self.first or where
            self.texts.append(piece)
            self.ends.append(False)
            self.pending_bytes += len(piece)
            if self.pending_bytes >= BATCH_BYTES:
                tokens += self.flush()
        if self.ends:
            self.ends[-1] = True
        else:  # the batch was tokenized on the document's last piece: EOS follows it
            tokens += self.write([self.eos])
        return tokens

    def flush(self) -> int:
        from msgen.data.tokenizer import encode

        if not self.texts:
            return 0
        stream: list[int] = []
        for ids, ends in zip(encode(self.tokenizer, self.texts, self.first), self.ends):
            stream += ids
            if ends:
                stream.append(self.eos)
        self.texts, self.ends, self.pending_bytes, self.first = [], [], 0, None
        return self.write(stream)

    def write(self, stream: list[int]) -> int:
        from msgen.data.mindrecord import WindowWriter

        windows = self.packer.add(stream)
        if len(windows) and self.writer is None:
            self.path.unlink(missing_ok=True)  # a killed run's attempt at this unit
            Path(f"{self.path}.db").unlink(missing_ok=True)
            self.writer = WindowWriter(self.path, self.path)
        if self.writer is not None:
            self.writer.write(windows)
        return len(stream)

    def finish(self) -> dict[str, str]:
        """Commit the file; its name and its index's name, each with its sha256."""
        self.flush()
        p = self.packer
        self.counts.tokens, self.counts.windows, self.counts.dropped = (
            p.tokens,
            p.windows,
            p.dropped,
        )
        if self.writer is None:
            return {}
        self.writer.commit()
        return {
            name: sha256_file(self.path.parent / name) for name in (self.file, f"{self.file}.db")
        }


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def run_unit(unit: Unit, job: Job, tokenizer, key: str, drop=frozenset()) -> UnitResult:
    """Tokenize, pack and write one unit; its record says it is done."""
    from msgen.data.tokenizer import SpecialCounter, special_texts

    counts = Counts()
    outputs = {name: Output(name, unit, job, tokenizer) for name in job.outputs}
    special = SpecialCounter(special_texts(tokenizer))
    for split, text, _, where in documents(unit, job, counts, drop):
        special.count(text)
        outputs[split].add(text, where)
    counts.special_token_texts = special.found
    files: dict[str, str] = {}
    for out in outputs.values():
        files |= out.finish()
    result = UnitResult(unit.index, counts, {n: o.counts for n, o in outputs.items()}, files)
    write_record(job.stage, unit.index, result.record(key))
    return result


def hash_unit(unit: Unit, job: Job) -> bytes:
    """The hashes of the unit's documents with text, in order (16 bytes each): what
    --dedup's plan finds the duplicates among."""
    return b"".join(digest for _, _, digest, _ in documents(unit, job, Counts()))


def sample_unit(unit: Unit, job: Job, fraction: float, drop=frozenset()) -> list[str]:
    """The unit's training documents a tokenizer learns from: those whose hash falls
    in the first `fraction` of the hash space (all of them at fraction 1)."""
    return [
        text
        for split, text, digest, _ in documents(unit, job, Counts(), drop)
        if split == TRAIN and int.from_bytes(digest[8:], "big") < fraction * 2**64
    ]


def record_path(stage: Path, index: int) -> Path:
    return stage / RECORDS / f"{index:05d}.json"


def write_record(stage: Path, index: int, record: dict) -> None:
    """Written last, and whole (a rename): a unit is done when its record is there."""
    path = record_path(stage, index)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, sort_keys=True), "utf-8")
    os.replace(tmp, path)


def failed(unit: Unit, exc: BaseException) -> DataError:
    """A unit's failure as one line that names its source."""
    reason = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not isinstance(exc, DataError | OSError):
        reason = f"{type(exc).__name__}: {reason}"
    return DataError(f"unit {unit.index} ({unit}) failed: {reason}")
