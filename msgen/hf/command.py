"""`msgen import hf CONFIG.json [-o SPEC] [--devices N ...]`: a Hugging Face config to a
spec laid out by fmt, its mesh chosen by the planner when devices are given."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from msgen.base.files import write_output
from msgen.base.status import EXIT_ERRORS, EXIT_OK, UsageError
from msgen.compiler import analyze_text, estimable
from msgen.diagnostics import printable
from msgen.estimate.planner import search
from msgen.hf.config import load_model
from msgen.hf.model import HfModel
from msgen.hf.spec import Setup, model_name, spec_text
from msgen.syntax.edit import write_settings
from msgen.syntax.fmt import format_text

DEFAULT_SEQ = 4096


@dataclass(frozen=True)
class ImportOptions:
    config: Path
    output: Path | None = None  # None: print the spec
    devices: int | None = None  # None: one device, no planning
    device: str = "ascend910b"
    per_node: int = 8
    seq: int | None = None  # None: max_position_embeddings, at most DEFAULT_SEQ
    name: str | None = None  # None: from the config's folder
    global_batch: int = 64
    force: bool = False


def _setup(model: HfModel, options: ImportOptions) -> Setup:
    devices = options.devices or 1
    if devices > options.per_node and devices % options.per_node:
        raise UsageError(
            f"--devices {devices} is not a whole number of {options.per_node}-device nodes"
        )
    seq = options.seq or min(model.max_positions or DEFAULT_SEQ, DEFAULT_SEQ)
    name = options.name or model_name(options.config.resolve().parent.name or model.family)
    if options.global_batch % devices:
        raise UsageError(
            f"--global-batch {options.global_batch} is not a multiple of {devices} devices"
        )
    return Setup(
        name=model_name(name),
        seq=seq,
        device=options.device,
        devices=devices,
        per_node=options.per_node,
        global_batch=options.global_batch,
        dp=devices,
    )


def _planned(text: str, file: str) -> tuple[str, str | None]:
    """The spec with the planner's first layout written in, and what was chosen."""
    result = analyze_text(text, file, Path("."))
    if not estimable(result) or result.facts is None:  # the planner reads a whole spec
        return text, None
    found = search(result.spec, result.facts, "time", 1)
    if not found.plans:
        return text, None
    sets = list(found.plans[0].layout.sets)
    return write_settings(text, sets, file), " ".join(sets)


def import_command(options: ImportOptions) -> int:
    model = load_model(options.config)
    if options.output is not None and options.output.exists() and not options.force:
        raise UsageError(f"-o {options.output} exists; add --force to replace it")
    setup = _setup(model, options)
    file = str(options.output or f"{setup.name}.msl")
    # the path goes into a comment: a line break or an escape in it would end the comment
    text = spec_text(model, setup, printable(options.config.as_posix()))
    chosen = None
    if setup.devices > 1:
        text, chosen = _planned(text, file)
    formatted, diags = format_text(text, file)
    if formatted is None:  # msgen wrote a spec it cannot read: a bug, not the user's
        raise RuntimeError(f"the imported spec does not parse: {diags}")
    result = analyze_text(formatted, file, Path("."))
    notes = list(model.notes)
    if model.max_positions and setup.seq > model.max_positions:
        notes.append(f"seq {setup.seq} is beyond max_position_embeddings {model.max_positions}")
    if chosen:
        notes.append(f"mesh chosen by the planner for {setup.devices} devices: {chosen}")
    elif setup.devices > 1:
        notes.append(f"no layout fits {setup.devices} devices: the spec keeps dp = {setup.devices}")
    codes = sorted({d.code for d in result.diagnostics if d.is_error})
    if codes:
        notes.append(f"the spec has errors ({', '.join(codes)}): run msgen check on it")
    if options.output is None:
        sys.stdout.write(formatted)
    else:
        write_output("-o", str(options.output), options.config, formatted)
        notes.append(f"wrote {options.output} ({model.params:,} parameters)")
    for note in notes:
        sys.stderr.write(f"note: {note}\n")
    # over budget is the cluster's size, which the user chooses next; anything else is not
    return EXIT_ERRORS if any(not code.startswith("MSL4") for code in codes) else EXIT_OK
