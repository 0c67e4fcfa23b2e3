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
from msgen.data.output import MANIFEST, Staging
from msgen.data.progress import Progress
from msgen.data.sources import INVALID_UTF8, Skipped, read, sources
from msgen.data.tokenizer import TRAINED_EOS
from msgen.diagnostics import Diagnostic, error

if TYPE_CHECKING:
    from msgen.data.mindrecord import WindowWriter
    from msgen.data.pack import Packer

FORMAT = "msgen-data 1"
TRAIN, VALID = "train", "valid"
BATCH_BYTES = 1 << 20  # text handed to the tokenizer at once: big enough for all cores
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
    progress: bool | None = None  # None: on a terminal, not in CI


@dataclass
class Counts:
    documents: int = 0  # documents read with text
    duplicates: int = 0
    normalized_documents: int = 0
    normalized_characters: int = 0
    skipped: Counter = field(default_factory=Counter)  # by reason
    shown: int = 0  # skipped documents already reported one by one

    def skip(self, item: Skipped, warn: bool) -> None:
        self.skipped[item.reason] += 1
        if warn and self.shown < MAX_WARNINGS:
            self.shown += 1
            sys.stderr.write(f"warning: {item.where}: {item.reason}, document skipped\n")


def in_valid(digest: bytes, fraction: float | None) -> bool:
    """A document's side of the split, from its content hash: the same for the same
    text whatever the input order, so a duplicate never lands on both sides."""
    return fraction is not None and int.from_bytes(digest[:8], "big") < fraction * 2**64


def documents(
    srcs, options: DataOptions, counts: Counts, warn: bool
) -> Iterator[tuple[str, str, int]]:
    """(split, normalised text, its UTF-8 size) of every document kept, in input order."""
    form = FORMS[options.normalize]
    seen: set[bytes] = set()
    for source in srcs:
        for item in read(source):
            if isinstance(item, Skipped):
                counts.skip(item, warn)
                continue
            text, changed = normalize(item.text, form)
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate, from a JSON `\ud800` escape
                counts.skip(Skipped(item.where, INVALID_UTF8), warn)
                continue
            if not text.strip():
                counts.skip(Skipped(item.where, "empty"), False)
                continue
            counts.documents += 1
            counts.normalized_documents += changed > 0
            counts.normalized_characters += changed
            digest = hashlib.blake2b(data, digest_size=16).digest()
            if options.dedup:
                if digest in seen:
                    counts.duplicates += 1
                    continue
                seen.add(digest)
            yield (VALID if in_valid(digest, options.valid) else TRAIN), text, len(data)


@dataclass
class Output:
    """One MindRecord being written: its documents, its packer and its writer."""

    name: str
    packer: Packer
    writer: WindowWriter
    documents: int = 0
    texts: list[str] = field(default_factory=list)
    pending_bytes: int = 0

    def flush(self, tokenizer, eos: int) -> None:
        if self.texts:
            encodings = tokenizer.encode_batch_fast(self.texts, add_special_tokens=False)
            self.writer.write(self.packer.add([e.ids for e in encodings], eos))
            self.texts, self.pending_bytes = [], 0


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


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
    names = [f"{o}.mindrecord{suffix}" for o in outputs for suffix in ("", ".db")]
    names += ["tokenizer.json"] * options.train_tokenizer + [MANIFEST]
    stage = Staging(folder, names, options.force, keep=options.tokenizer)
    tokenizer = tok.load(options.tokenizer) if options.tokenizer is not None else None
    diags = check_vocab(result, tokenizer)
    if diags:
        return diags
    if tokenizer is not None:
        eos, eos_id = tok.find_eos(tokenizer, options.tokenizer, options.eos)

    with stage:
        if options.train_tokenizer:
            texts = (
                t for split, t, _ in documents(srcs, options, Counts(), False) if split == TRAIN
            )
            tokenizer = tok.train(texts, vocab)
            eos, eos_id = tok.TRAINED_EOS, tokenizer.token_to_id(tok.TRAINED_EOS)
            (stage.path / "tokenizer.json").write_text(tokenizer.to_str(pretty=True), "utf-8")
        counts, written = write_sets(srcs, options, tokenizer, eos_id, stage.path, outputs, seq)
        short = too_little(result, written.values(), spec.train.global_batch)
        if short:
            return short
        tokenizer_path = (
            stage.path / "tokenizer.json" if options.train_tokenizer else options.tokenizer
        )
        manifest = dataset_json(
            result, options, counts, written.values(), eos, eos_id, tokenizer_path
        )
        (stage.path / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", "utf-8")
        stage.commit()
    print_summary(folder, result, counts, written.values(), spec.train.global_batch, options)
    return []


def write_sets(srcs, options, tokenizer, eos_id, folder: Path, outputs, seq):
    """The one pass that writes `<set>.mindrecord` for each set into `folder`;
    returns the counts and the finished outputs by set."""
    from msgen.data.mindrecord import WindowWriter
    from msgen.data.pack import Packer

    counts = Counts()
    written = {
        o: Output(o, Packer(seq + 1, options.overlap), WindowWriter(folder / f"{o}.mindrecord"))
        for o in outputs
    }
    progress = Progress("msgen data", options.progress)
    for split, text, size in documents(srcs, options, counts, True):
        out = written[split]
        out.documents += 1
        out.texts.append(text)
        out.pending_bytes += size
        progress.update(size, 1)
        if out.pending_bytes >= BATCH_BYTES:
            out.flush(tokenizer, eos_id)
    progress.done()
    for out in written.values():
        out.flush(tokenizer, eos_id)
        out.writer.commit()
    return counts, written


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


def split_counts(out: Output, global_batch: int) -> dict:
    return {
        "documents": out.documents,
        "tokens": out.packer.tokens,
        "windows": out.packer.windows,
        "dropped_tokens": out.packer.dropped,
        "steps": out.packer.windows // global_batch,
    }


def dataset_json(result, options, counts: Counts, outputs, eos, eos_id, tokenizer_path) -> dict:
    """What train.py checks the data against (vocab, seq), and how it was made.
    No timestamps or absolute paths: the same input gives the same bytes."""
    spec = result.spec
    return {
        "format": FORMAT,
        "vocab": spec.model.dims["vocab"],
        "seq": spec.model.dims["seq"],
        "column": "input_ids",
        "eos": eos,
        "eos_id": eos_id,
        "tokenizer": {
            "path": "tokenizer.json" if options.train_tokenizer else tokenizer_path.as_posix(),
            "sha256": sha256_file(tokenizer_path),
            "trained": options.train_tokenizer,
        },
        "normalization": options.normalize,
        "overlap": options.overlap,
        "dedup": options.dedup,
        "valid_fraction": options.valid,
        # Informational: adding the data line to the spec changes its hash.
        "spec": {"file": result.file, "sha256": spec.sha256},
        "global_batch": spec.train.global_batch,
        "counts": {
            "documents": counts.documents,
            "duplicates": counts.duplicates,
            "skipped": dict(sorted(counts.skipped.items())),
            "normalized_documents": counts.normalized_documents,
            "normalized_characters": counts.normalized_characters,
            **{out.name: split_counts(out, spec.train.global_batch) for out in outputs},
        },
        "files": {out.name: f"{out.name}.mindrecord" for out in outputs},
    }


def print_summary(folder: Path, result, counts: Counts, outputs, global_batch, options) -> None:
    err = sys.stderr
    skipped = sum(counts.skipped.values())
    err.write(
        f"{folder.as_posix()}: {counts.documents:,} documents"
        f" ({skipped:,} skipped, {counts.duplicates:,} duplicates removed)\n"
    )
    if skipped > counts.shown:
        reasons = ", ".join(f"{n:,} {reason}" for reason, n in sorted(counts.skipped.items()))
        err.write(f"  skipped: {reasons}\n")
    if options.normalize != "none":
        err.write(
            f"  {options.normalize.upper()} changed {counts.normalized_characters:,} characters "
            f"in {counts.normalized_documents:,} documents\n"
        )
    for out in outputs:
        c = split_counts(out, global_batch)
        err.write(
            f"  {out.name}.mindrecord: {c['documents']:,} documents, {c['tokens']:,} tokens, "
            f"{c['windows']:,} windows of {out.packer.length} ({c['dropped_tokens']:,} tail "
            f"tokens dropped), {c['steps']:,} steps at global batch {global_batch}\n"
        )
    paths = {out.name: (folder / f"{out.name}.mindrecord").as_posix() for out in outputs}
    line = f'data = mindrecord("{paths[TRAIN]}"'
    line += f', valid = "{paths[VALID]}")' if VALID in paths else ")"
    err.write(
        f"put this in the train block of {result.file} (paths are relative to where "
        "train.py runs):\n"
    )
    sys.stdout.write(f"    {line}\n")
