"""What `msgen data` says and records: the skipped-document warnings and the summary
in the chosen --error-format, the data line to paste into the spec, and
dataset.json."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from msgen.data import DataError
from msgen.data.output import FORMAT, MANIFEST
from msgen.data.readers import Skipped
from msgen.data.sources import shown
from msgen.diagnostics import Span, warning

TRAIN, VALID = "train", "valid"
# dataset.json's "files" and "digests" are this format's; "files" was one name a set
# before units (train.py reads both).


def skipped_warning(item: Skipped, fmt: str) -> str:
    """MSL603 for a skipped document, rendered as every diagnostic is."""
    from msgen.base.render import render

    where = item.where
    at = f" at byte {where.byte}" if where.byte is not None else ""
    if where.line is not None:
        file = str(where.file)
        span = Span(file=file, line=where.line, col=1, end_line=where.line, end_col=1)
        message = f"{item.reason}{at}, document skipped"
    else:
        span, message = None, f"{where}: {item.reason}, document skipped"
    return render([warning("MSL603", message, span)], fmt, {})


def data_path(folder: Path, name: str, base: Path) -> str:
    """`folder/name` as a spec names it for a train.py that runs in `base`: relative
    to `base` (both taken from the current folder), or absolute if given so."""
    path = folder / name
    if not path.is_absolute():
        path = Path(os.path.relpath(os.path.abspath(path), os.path.abspath(base)))
    return path.as_posix()


def data_line(folder: Path, outputs: list[str], base: Path) -> str:
    """`data = mindrecord(".../dataset.json")` for the spec (train.py reads the files
    the manifest lists for the set); a path a spec's string cannot hold (a double
    quote, a line break, a control character) is refused before any work."""
    paths = [data_path(folder, MANIFEST, base) for _ in outputs]
    for path in paths:
        if '"' in path or not path.isprintable():
            raise DataError(
                f"-o {shown(folder)}: a spec's string cannot hold the path {shown(path)}",
                'choose a folder whose name has no `"` and no control character',
            )
    line = f'data = mindrecord("{paths[0]}"'
    return line + (f', valid = "{paths[1]}")' if len(paths) > 1 else ")")


def split_counts(out, global_batch: int) -> dict:
    return {
        "documents": out.documents,
        "tokens": out.tokens,
        "windows": out.windows,
        "dropped_tokens": out.dropped,
        "steps": out.windows // global_batch,
    }


def dataset_json(
    result, options, counts, outputs, eos, tokenizer_bytes, folder: Path, files: dict, digests
) -> dict:
    """What train.py checks the data against (vocab, seq), and how it was made.
    No timestamps or absolute paths: the same input gives the same bytes."""
    spec = result.spec
    if options.train_tokenizer:
        tokenizer_path = "tokenizer.json"
    else:  # relative to DIR, so the record holds no absolute path
        tokenizer_path = Path(
            os.path.relpath(os.path.abspath(options.tokenizer), os.path.abspath(folder))
        ).as_posix()
    return {
        "format": FORMAT,
        "vocab": spec.model.dims["vocab"],
        "seq": spec.model.dims["seq"],
        "column": "input_ids",
        "eos": eos[0],
        "eos_id": eos[1],
        "tokenizer": {
            "path": tokenizer_path,
            "sha256": hashlib.sha256(tokenizer_bytes).hexdigest(),
            "trained": options.train_tokenizer,
        },
        "normalization": options.normalize,
        "overlap": options.overlap,
        "dedup": options.dedup,
        "valid_fraction": options.valid,
        "unit_size": options.unit_size,
        # Informational: adding the data line to the spec changes its hash.
        "spec": {"file": result.file, "sha256": spec.sha256},
        "global_batch": spec.train.global_batch,
        "counts": {
            "documents": counts.documents,
            "duplicates": counts.duplicates,
            "skipped": dict(sorted(counts.skipped.items())),
            "cut_documents": counts.cut_documents,
            "special_token_texts": counts.special_token_texts,
            "normalized_documents": counts.normalized_documents,
            "normalized_characters": counts.normalized_characters,
            **{out.name: split_counts(out, spec.train.global_batch) for out in outputs},
        },
        # in dataset order; a unit whose set holds no whole window has no file
        "files": files,
        "digests": dict(sorted(digests.items())),  # sha256 of each file and its index
    }


def summary_lines(folder: Path, counts, outputs, global_batch: int, options) -> list[str]:
    skipped = sum(counts.skipped.values())
    lines = [
        f"{shown(folder.as_posix())}: {counts.documents:,} documents"
        f" ({skipped:,} skipped, {counts.duplicates:,} duplicates removed)"
    ]
    if skipped > len(counts.shown):
        reasons = ", ".join(f"{n:,} {reason}" for reason, n in sorted(counts.skipped.items()))
        lines.append(f"  skipped: {reasons}")
    if counts.cut_documents:
        lines.append(f"  {counts.cut_documents:,} documents are pieces of longer texts, cut")
    if counts.special_token_texts:
        lines.append(
            f"  {counts.special_token_texts:,} special-token texts in documents "
            "(such as <|endoftext|>), encoded as plain text"
        )
    if options.normalize != "none":
        lines.append(
            f"  {options.normalize.upper()} changed {counts.normalized_characters:,} characters "
            f"in {counts.normalized_documents:,} documents"
        )
    for out in outputs:
        c = split_counts(out, global_batch)
        lines.append(
            f"  {out.name}: {c['documents']:,} documents, {c['tokens']:,} tokens, "
            f"{c['windows']:,} windows of {out.length} ({c['dropped_tokens']:,} tail "
            f"tokens dropped), {c['steps']:,} steps at global batch {global_batch}"
        )
    return lines


def report(
    folder: Path, result, counts, outputs, manifest: dict, line: str, options, run: list[str]
) -> None:
    """The summary on stderr (text, one JSON object, or GitHub notices) and the data
    line on stdout, where a script or a person takes it from."""
    from msgen.base.render import escape_workflow

    err, fmt = sys.stderr, options.error_format
    base = options.for_dir or Path("generated") / result.spec.model.name
    if fmt == "json":
        summary = {"dataset": folder.as_posix(), "counts": manifest["counts"], "data": line,
                   "run": run}  # fmt: skip
        err.write(json.dumps({"summary": summary}, sort_keys=True) + "\n")
    else:
        lines = summary_lines(folder, counts, outputs, result.spec.train.global_batch, options)
        lines += [f"  {text}" for text in run]
        where = f"{shown(base.as_posix())}/" if options.for_dir else (
            f"{shown(base.as_posix())}/, where `msgen compile {shown(result.file)} -o generated/` "
            "puts train.py; --for DIR if it runs elsewhere"
        )  # fmt: skip
        lines.append(
            f"put this in the train block of {shown(result.file)} (paths relative to {where}):"
        )
        if fmt == "github":
            err.write(f"::notice title=msgen data::{escape_workflow(chr(10).join(lines))}\n")
        else:
            err.write("".join(f"{text}\n" for text in lines))
    sys.stdout.write(f"    {line}\n")
