"""`msgen data SPEC INPUT... [-o DIR]`: read, normalise, deduplicate, split, tokenize
and pack a corpus for one spec, and write the dataset all or nothing."""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from msgen.data import DataError
from msgen.data.normalize import FORMS, normalize
from msgen.data.output import MANIFEST, Staging, os_error, stops_interrupt
from msgen.data.progress import Progress
from msgen.data.readers import INVALID_UTF8, Cursor, Skipped, Where, read
from msgen.data.sources import shown, sources
from msgen.data.summary import TRAIN, VALID, data_line, dataset_json, report, skipped_warning
from msgen.data.tokenizer import TRAINED_EOS
from msgen.diagnostics import Diagnostic, error

if TYPE_CHECKING:
    from msgen.data.mindrecord import WindowWriter
    from msgen.data.pack import Packer

BATCH_BYTES = 1 << 20  # text handed to the tokenizer at once: big enough for all cores
PIECE = 1 << 18  # characters of one document handed to the tokenizer at most at once
MAX_WARNINGS = 10  # skipped documents shown one by one; the rest are counted


@dataclass(frozen=True)
class DataOptions:
    inputs: tuple[Path, ...]
    output: Path | None = None  # default: data/<model>/
    field: str = "text"
    paragraphs: bool = False
    normalize: str = "nfkc"
    tokenizer: Path | None = None
    train_tokenizer: bool = False
    eos: str | None = None
    overlap: int = 0
    dedup: bool = False
    valid: float | None = None
    force: bool = False
    for_dir: Path | None = None  # where train.py runs; default generated/<model>/
    error_format: str = "text"
    progress: bool | None = None  # None: on a terminal, not in CI


@dataclass
class Counts:
    documents: int = 0  # documents read with text
    duplicates: int = 0
    normalized_documents: int = 0
    normalized_characters: int = 0
    cut_documents: int = 0  # pieces of texts longer than MAX_DOCUMENT
    special_token_texts: int = 0
    skipped: Counter = field(default_factory=Counter)  # by reason
    shown: int = 0  # skipped documents already reported one by one
    keys: tuple[str, ...] | None = None  # of the first record without the field

    def skip(self, item: Skipped, warn: bool, fmt: str) -> None:
        self.skipped[item.reason] += 1
        if self.keys is None and item.keys:
            self.keys = item.keys
        if warn and self.shown < MAX_WARNINGS:
            self.shown += 1
            sys.stderr.write(skipped_warning(item, fmt))


def in_valid(digest: bytes, fraction: float | None) -> bool:
    """A document's side of the split, from its content hash: the same for the same
    text whatever the input order, so a duplicate never lands on both sides."""
    return fraction is not None and int.from_bytes(digest[:8], "big") < fraction * 2**64


def documents(
    srcs, options: DataOptions, counts: Counts, warn: bool, cursor: Cursor
) -> Iterator[tuple[str, str, Where]]:
    """(split, normalised text, where) of every document kept, in input order."""
    form = FORMS[options.normalize]
    seen: set[bytes] = set()
    for source in srcs:
        for item in read(source, cursor):
            if isinstance(item, Skipped):
                counts.skip(item, warn, options.error_format)
                continue
            text, changed = normalize(item.text, form)
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate, from a JSON `\ud800` escape
                counts.skip(Skipped(item.where, INVALID_UTF8), warn, options.error_format)
                continue
            if not text.strip():
                counts.skip(Skipped(item.where, "empty"), False, options.error_format)
                continue
            counts.documents += 1
            counts.cut_documents += item.cut
            counts.normalized_documents += changed > 0
            counts.normalized_characters += changed
            digest = hashlib.blake2b(data, digest_size=16).digest()
            if options.dedup:
                if digest in seen:
                    counts.duplicates += 1
                    continue
                seen.add(digest)
            yield (VALID if in_valid(digest, options.valid) else TRAIN), text, item.where


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


@dataclass
class Output:
    """One MindRecord being written: its documents, its packer and its writer."""

    name: str
    packer: Packer
    writer: WindowWriter
    documents: int = 0
    texts: list[str] = field(default_factory=list)  # pieces waiting for the tokenizer
    ends: list[bool] = field(default_factory=list)  # whether each ends its document
    pending_bytes: int = 0
    first: Where | None = None  # where the waiting text starts, for a tokenizer error

    def add(self, text: str, where: Where, tokenizer, eos: int) -> int:
        """Queue a document; tokenize when a batch is full. Returns the tokens packed."""
        self.documents += 1
        tokens = 0
        for piece in pieces(text):
            self.first = self.first or where
            self.texts.append(piece)
            self.ends.append(False)
            self.pending_bytes += len(piece)
            if self.pending_bytes >= BATCH_BYTES:
                tokens += self.flush(tokenizer, eos)
        if self.ends:
            self.ends[-1] = True
        else:  # the batch was tokenized on the document's last piece: EOS follows it
            tokens += self.write([eos])
        return tokens

    def flush(self, tokenizer, eos: int) -> int:
        from msgen.data.tokenizer import encode

        if not self.texts:
            return 0
        stream: list[int] = []
        for ids, ends in zip(encode(tokenizer, self.texts, self.first), self.ends):
            stream += ids
            if ends:
                stream.append(eos)
        self.texts, self.ends, self.pending_bytes, self.first = [], [], 0, None
        return self.write(stream)

    def write(self, stream: list[int]) -> int:
        self.writer.write(self.packer.add(stream))
        return len(stream)


def check_options(options: DataOptions, seq: int) -> None:
    if options.tokenizer is None and not options.train_tokenizer:
        raise DataError(
            "no tokenizer", "pass --tokenizer tokenizer.json, or --train-tokenizer to train one"
        )
    if options.tokenizer is not None and options.train_tokenizer:
        raise DataError("--tokenizer and --train-tokenizer exclude each other")
    if options.train_tokenizer and options.eos is not None:
        raise DataError(f"--eos: a trained tokenizer's EOS is {TRAINED_EOS}")
    if not 0 <= options.overlap < seq + 1:
        raise DataError(
            f"--overlap {options.overlap} is out of range",
            f"a window holds seq + 1 = {seq + 1} tokens: overlap is 0 .. {seq}",
        )
    if options.valid is not None and not 0 < options.valid < 1:
        raise DataError(f"--valid {options.valid} is out of range", "a fraction such as 0.01")
    if options.normalize not in FORMS:
        raise DataError(f"--normalize {options.normalize}: one of {', '.join(FORMS)}")


def check_vocab(result, tokenizer) -> list[Diagnostic]:
    """MSL601: every id the tokenizer (given, or to be trained) can produce is below
    the spec's vocab."""
    from msgen.data.tokenizer import BYTE_ALPHABET, id_count

    model = result.spec.model
    vocab = model.dims["vocab"]
    span = model.spans.get("vocab", model.span)
    if tokenizer is None and vocab <= BYTE_ALPHABET:
        return [
            error(
                "MSL601",
                f"vocab = {vocab} leaves no room for a byte-level BPE: it needs the "
                f"{BYTE_ALPHABET} bytes and EOS",
                span,
                f"make vocab larger than {BYTE_ALPHABET}, or bring a tokenizer with --tokenizer",
            )
        ]
    ids = id_count(tokenizer) if tokenizer is not None else 0
    if ids > vocab:
        return [
            error(
                "MSL601",
                f"the tokenizer's ids go up to {ids - 1}, beyond vocab = {vocab}",
                span,
                f"make vocab at least {ids} (a multiple of 64 or 128 is usual), or use a "
                "smaller tokenizer",
            )
        ]
    return []


def data_command(result, options: DataOptions) -> list[Diagnostic]:
    """Write the dataset for the checked spec in `result`; return the diagnostics that
    stopped it (none: written). Raises DataError for bad flags, inputs or output."""
    from msgen.data import tokenizer as tok
    from msgen.data.mindrecord import import_file_writer

    spec = result.spec
    vocab, seq = spec.model.dims["vocab"], spec.model.dims["seq"]
    # Everything that can be wrong is found before any document is read.
    check_options(options, seq)
    srcs = sources(list(options.inputs), options.field, options.paragraphs)
    import_file_writer()  # before the packer, whose numpy comes with MindSpore
    folder = options.output or Path("data") / spec.model.name
    outputs = [TRAIN] + ([VALID] if options.valid is not None else [])
    # a validation set is evaluated only without pipeline stages (MSL514): with pp > 1
    # valid.mindrecord is written for a pp = 1 run, and the line names the train file only
    named = outputs if spec.mesh.pp == 1 else [TRAIN]
    line = data_line(folder, named, options.for_dir or Path("generated") / spec.model.name)
    if named != outputs:
        sys.stderr.write(
            "note: pp > 1 evaluates no validation set (MSL514): the line names the train "
            "file only; valid.mindrecord is written for a run with pp = 1\n"
        )
    names = [f"{o}.mindrecord{suffix}" for o in outputs for suffix in ("", ".db")]
    names += ["tokenizer.json"] * options.train_tokenizer + [MANIFEST]
    stage = Staging(folder, names, options.force, keep=options.tokenizer)
    tokenizer = tokenizer_bytes = None
    if options.tokenizer is not None:
        tokenizer, tokenizer_bytes = tok.load(options.tokenizer)
    diags = check_vocab(result, tokenizer)
    if diags:
        return diags
    if tokenizer is not None:
        eos, eos_id = tok.find_eos(tokenizer, options.tokenizer, options.eos)

    total = sum(s.size for s in srcs)
    # each reading phase reads it all; json and github streams get no progress line
    drawn = options.progress if options.error_format == "text" else False
    progress = Progress("msgen data", total, drawn)
    with stops_interrupt(), stage:
        try:
            if options.train_tokenizer:
                progress.phase("training the tokenizer on")
                tokenizer = train_tokenizer(srcs, options, vocab, progress)
                tokenizer_bytes = tokenizer.to_str(pretty=True).encode("utf-8")
                eos, eos_id = tok.TRAINED_EOS, tokenizer.token_to_id(tok.TRAINED_EOS)
                (stage.path / "tokenizer.json").write_bytes(tokenizer_bytes)
            counts, written = write_sets(
                srcs, options, tokenizer, eos_id, stage.path, folder, outputs, seq, progress
            )
        except OSError as exc:
            raise os_error(exc, "write") from None
        finally:
            progress.done()
        if not counts.documents:
            raise nothing_read(counts, options.field)
        short = too_little(result, written.values(), spec.train.global_batch)
        if short:
            return short
        manifest = dataset_json(
            result, options, counts, written.values(), (eos, eos_id), tokenizer_bytes, folder
        )
        try:
            (stage.path / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", "utf-8")
            stage.commit()
        except OSError as exc:
            raise os_error(exc, "write") from None
    report(folder, result, counts, written.values(), manifest, line, options)
    return []


def train_tokenizer(srcs, options, vocab: int, progress: Progress):
    from msgen.data import tokenizer as tok

    cursor = Cursor()

    def texts():
        for split, text, _ in documents(srcs, options, Counts(), False, cursor):
            progress.update(cursor.position(), 1)
            if split == TRAIN:
                yield text

    trained = tok.train(texts(), vocab)
    tok.plain_text(trained, "the trained tokenizer")
    return trained


def write_sets(srcs, options, tokenizer, eos_id, stage: Path, folder: Path, outputs, seq, progress):
    """The one pass that writes `<set>.mindrecord` for each set into `stage`;
    returns the counts and the finished outputs by set."""
    from msgen.data.mindrecord import WindowWriter
    from msgen.data.pack import Packer
    from msgen.data.tokenizer import SpecialCounter, special_texts

    counts = Counts()
    written = {
        o: Output(
            o,
            Packer(seq + 1, options.overlap),
            WindowWriter(stage / f"{o}.mindrecord", folder / f"{o}.mindrecord"),
        )
        for o in outputs
    }
    special = SpecialCounter(special_texts(tokenizer))
    cursor = Cursor()
    progress.phase("tokenizing")
    for split, text, where in documents(srcs, options, counts, True, cursor):
        special.count(text)
        tokens = written[split].add(text, where, tokenizer, eos_id)
        progress.update(cursor.position(), 1, tokens)
    for out in written.values():
        progress.update(cursor.position(), 0, out.flush(tokenizer, eos_id))
    progress.phase("writing the index")
    for out in written.values():
        out.writer.commit()
    counts.special_token_texts = special.found
    return counts, written


def nothing_read(counts: Counts, field_name: str) -> DataError:
    """No document at all: the input is at fault (a wrong --field, most often), not
    the spec's seq, which MSL602 would blame."""
    reasons = ", ".join(f"{n:,} {reason}" for reason, n in sorted(counts.skipped.items()))
    hint = "check the inputs"
    if counts.keys is not None:
        keys = ", ".join(shown(k) for k in counts.keys[:10])
        hint = f"the first record's keys are {keys}; --field names the one holding the text"
    return DataError(f"no document to write ({reasons or 'the inputs are empty'})", hint)


def too_little(result, outputs, global_batch: int) -> list[Diagnostic]:
    """train.py reads whole global batches: each file needs at least one."""
    model = result.spec.model
    return [
        error(
            "MSL602",
            f"the {out.name} set makes {out.packer.windows} windows of seq + 1 = "
            f"{out.packer.length} tokens, fewer than one global batch ({global_batch})",
            model.spans.get("seq", model.span),
            "add text"
            + (", or raise --valid" if out.name == VALID else "")
            + ", or lower seq or global_batch",
        )
        for out in outputs
        if out.packer.windows < global_batch
    ]
