"""`msgen diff OLD NEW | --base REF SPEC [--set K=V] [--format F] [-o FILE]`."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from msgen.base.files import write_output
from msgen.base.status import EXIT_ERRORS, EXIT_OK, UsageError
from msgen.compiler import Result, analyze, analyze_text, display_path, spec_label
from msgen.review.diff import diff_sides
from msgen.review.model import DiffReport
from msgen.review.render import render_json, render_markdown, render_text
from msgen.review.sides import load_side
from msgen.syntax.overrides import override_keys

RENDER = {"text": render_text, "markdown": render_markdown, "json": render_json}


@dataclass(frozen=True)
class DiffOptions:
    new: Path
    old: Path | None = None  # None: the NEW spec at `base`
    base: str | None = None
    overrides: tuple[str, ...] = ()  # --set: NEW only
    format: str = "text"
    output: str | None = None


def _read(path: Path, overrides: tuple[str, ...] = ()) -> Result:
    if not path.is_file():
        raise UsageError(f"no such spec file: {path}")
    try:
        return analyze(path, list(overrides))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc


def _old(options: DiffOptions) -> tuple[str, Result]:
    if options.base is None:
        return spec_label(options.old), _read(options.old)
    from msgen.review.git import spec_at

    label = f"{options.base}:{spec_label(options.new)}"
    text = spec_at(options.base, options.new)
    # files the spec names (hccn) are read from today's folder: git keeps no other
    return label, analyze_text(text, label, options.new.parent)


def diff_report(options: DiffOptions) -> DiffReport:
    new_result = _read(options.new, options.overrides)
    old_label, old_result = _old(options)
    emitted_as = display_path(options.new)
    old = load_side(old_label, old_result, emitted_as)
    sets = "".join(f" --set {o}" for o in options.overrides)  # NEW and OLD may be one file
    new = load_side(new_result.file + sets, new_result, emitted_as)
    return diff_sides(old, new, override_keys(list(options.overrides)))


def diff_command(options: DiffOptions) -> int:
    """Print (or write) the diff; 1 when NEW has errors or is over its budget."""
    report = diff_report(options)
    text = RENDER[options.format](report)
    if options.output is None:
        sys.stdout.write(text)
    else:
        target = Path(options.output)
        if options.old is not None and target.exists() and target.samefile(options.old):
            raise UsageError(f"-o {options.output} is the spec itself; name another file")
        write_output("-o", options.output, options.new, text)
    return EXIT_OK if report.new.status == "ok" else EXIT_ERRORS
