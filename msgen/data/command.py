"""`msgen data SPEC INPUT... [-o DIR]`: read, normalise, deduplicate, split, tokenize
and pack a corpus for one spec, unit by unit on every core (or on Ray), and write
the dataset all or nothing."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from msgen.data import DataError
from msgen.data.normalize import FORMS
from msgen.data.output import MANIFEST, Staging, os_error, stops_interrupt
from msgen.data.progress import Progress
from msgen.data.sources import shown, sources
from msgen.data.summary import TRAIN, VALID, data_line, dataset_json, report
from msgen.data.tokenizer import TRAINED_EOS
from msgen.data.units import UNIT_SIZE, plan
from msgen.data.work import file_name
from msgen.diagnostics import Diagnostic, error

ENGINES = ("local", "ray")


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
    workers: int = 0  # 0: the machine's cores
    engine: str = "local"
    ray_address: str | None = None
    resume: bool = False
    unit_size: int = UNIT_SIZE

    @property
    def worker_count(self) -> int:
        return self.workers or len(os.sched_getaffinity(0))


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
    if options.workers < 0:
        raise DataError(f"--workers {options.workers}: a count of processes, 1 or more")
    if options.engine not in ENGINES:
        raise DataError(f"--engine {options.engine}: one of {', '.join(ENGINES)}")
    if options.ray_address is not None and options.engine != "ray":
        raise DataError("--ray-address needs --engine ray")
    if options.resume and options.force:
        raise DataError("--resume and --force exclude each other")


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
    from msgen.data import phases
    from msgen.data import tokenizer as tok
    from msgen.data.mindrecord import import_file_writer

    spec = result.spec
    seq = spec.model.dims["seq"]
    # Everything that can be wrong is found before any document is read.
    check_options(options, seq)
    srcs = sources(list(options.inputs), options.field, options.paragraphs)
    import_file_writer()  # before the packer, whose numpy comes with MindSpore
    folder = options.output or Path("data") / spec.model.name
    outputs = [TRAIN] + ([VALID] if options.valid is not None else [])
    # a validation set is evaluated only without pipeline stages (MSL514): with pp > 1
    # the valid files are written for a pp = 1 run, and the line names the train set only
    named = outputs if spec.mesh.pp == 1 else [TRAIN]
    line = data_line(folder, named, options.for_dir or Path("generated") / spec.model.name)
    if named != outputs:
        sys.stderr.write(
            "note: pp > 1 evaluates no validation set (MSL514): the line names the train "
            "set only; its files are written for a run with pp = 1\n"
        )
    units = plan(srcs, options.unit_size)
    names = [f"{file_name(o, u.index)}{x}" for u in units for o in outputs for x in ("", ".db")]
    names += ["tokenizer.json"] * options.train_tokenizer + [MANIFEST]
    stage = Staging(folder, names, options.force, keep=options.tokenizer, resume=options.resume)
    tokenizer = tokenizer_bytes = eos = None
    if options.tokenizer is not None:
        tokenizer, tokenizer_bytes = tok.load(options.tokenizer)
    diags = check_vocab(result, tokenizer)
    if diags:
        return diags
    if tokenizer is not None:
        eos = tok.find_eos(tokenizer, options.tokenizer, options.eos)

    # json and github streams get no progress line
    drawn = options.progress if options.error_format == "text" else False
    progress = Progress("msgen data", sum(u.size for u in units), drawn, len(units))
    run = phases.Run(options, units, progress, seq, spec.model.dims["vocab"])
    with stops_interrupt(), stage:
        try:
            with run.engine():
                done = run.all(stage, folder, outputs, tokenizer, tokenizer_bytes, eos)
        except OSError as exc:
            raise os_error(exc, "write") from None
        except DataError as exc:
            raise resumable(exc, stage) from None
        except KeyboardInterrupt:
            if stage.units_done():
                sys.stderr.write(f"{resumable_note(stage)}\n")
            raise
        finally:
            progress.done()
        counts, sets, files, digests = done
        short = too_little(result, sets.values(), spec.train.global_batch)
        if short or not counts.documents:
            stage.discard()
        if not counts.documents:
            raise nothing_read(counts, options.field)
        if short:
            return short
        manifest = dataset_json(
            result, options, counts, sets.values(), run.eos, run.tokenizer_bytes, folder,
            files, digests,
        )  # fmt: skip
        try:
            (stage.path / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", "utf-8")
            stage.commit([*digests, *["tokenizer.json"] * options.train_tokenizer, MANIFEST])
        except OSError as exc:
            raise os_error(exc, "write") from None
    report(folder, result, counts, sets.values(), manifest, line, options, run.summary())
    return []


def resumable_note(stage: Staging) -> str:
    return (
        f"note: {stage.units_done():,} units are done in {shown(stage.path)}; the same "
        "command with --resume goes on from them"
    )


def resumable(exc: DataError, stage: Staging) -> DataError:
    """A failure after some units were done says how to go on from them."""
    if not stage.units_done():
        return exc
    hint = "; ".join(h for h in (exc.hint, resumable_note(stage).removeprefix("note: ")) if h)
    return DataError(str(exc), hint)


def nothing_read(counts, field_name: str) -> DataError:
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
            f"the {out.name} set makes {out.windows} windows of seq + 1 = "
            f"{out.length} tokens, fewer than one global batch ({global_batch})",
            model.spans.get("seq", model.span),
            "add text"
            + (", or raise --valid" if out.name == VALID else "")
            + ", or lower seq or global_batch",
        )
        for out in outputs
        if out.windows < global_batch
    ]
