"""`msgen fmt [--check] SPEC...`."""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from pathlib import Path

from msgen.base.files import write_file
from msgen.base.render import render, sort_key
from msgen.base.status import EXIT_ERRORS, EXIT_OK, EXIT_STALE, UsageError
from msgen.compiler import spec_label
from msgen.syntax import read_source
from msgen.syntax.edit import lines_with_ends
from msgen.syntax.fmt import format_text


@dataclass(frozen=True)
class FmtOptions:
    files: tuple[str, ...]
    check: bool = False


def fmt_command(options: FmtOptions) -> int:
    """`msgen fmt [--check] FILE...`: all or nothing, like compile: a syntax error in
    any file, and no file is touched."""
    paths = [Path(f) for f in options.files]
    for path, name in zip(paths, options.files):
        if not path.is_file():
            raise UsageError(f"no such spec file: {name}")
    results = []
    failed = False
    for path, name in zip(paths, options.files):
        try:
            # As compile reads it; a CRLF file must show up as changed.
            text = read_source(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {name}: {exc}") from exc
        out, diags = format_text(text, spec_label(path))
        if out is None:
            sys.stderr.write(render(sorted(diags, key=sort_key), "text", {spec_label(path): text}))
            failed = True
        results.append((path, name, text, out))
    if failed:
        return EXIT_ERRORS
    changed = [(path, name, text, out) for path, name, text, out in results if out != text]
    for path, name, text, out in changed:
        if options.check:
            sys.stderr.write(f"would reformat {name}\n")
            diff = difflib.unified_diff(
                lines_with_ends(text),  # numbered as diagnostics number them
                lines_with_ends(out),
                fromfile=name,
                tofile=f"{name} (formatted)",
            )
            sys.stdout.write("".join(d if d.endswith("\n") else d + "\n" for d in diff))
        else:
            write_file(path, out)
            sys.stderr.write(f"reformatted {name}\n")
    if options.check and changed:
        return EXIT_STALE
    return EXIT_OK
