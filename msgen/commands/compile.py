"""`msgen compile SPEC -o DIR [--check] [--force]`."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from msgen.analysis.plan import build_plan
from msgen.base.status import EXIT_OK, EXIT_STALE, EXIT_USAGE
from msgen.base.tree import (
    DamagedManifest,
    EditedByHand,
    InTheWay,
    NotOurs,
    OtherSpec,
    compiled_record,
    diff_tree,
    write_tree,
)
from msgen.compiler import display_path
from msgen.emit import emit, notes
from msgen.syntax.overrides import flags


@dataclass(frozen=True)
class CompileOptions:
    spec: Path
    output: Path
    check: bool = False
    force: bool = False


def compile_command(result, options: CompileOptions) -> int:
    plan = build_plan(result.spec, result.facts)
    # headers name the spec relative to the current folder (result.file is its label)
    files = emit(plan, display_path(options.spec), result.sets)
    out = options.output
    folder = out / result.spec.model.name
    label = (out / result.spec.model.name).as_posix()
    if options.check:
        diff = diff_tree(folder, files, label)
        if diff:
            sys.stdout.write(diff)
            sys.stderr.write(f"msgen: {label} is stale; run `msgen compile` to update it\n")
            record = compiled_record(folder)
            if record is not None and record.sets != result.sets:
                made, given = (flags(sets) or "no --set" for sets in (record.sets, result.sets))
                sys.stderr.write(
                    f"  = hint: {label} was compiled with {made}; this check has {given}: "
                    "--check takes the flags the tree was compiled with\n"
                )
            return EXIT_STALE
        return EXIT_OK
    try:
        change = write_tree(folder, files, force=options.force)
    except NotOurs as exc:
        sys.stderr.write(
            f"msgen: error: refusing to overwrite files msgen did not write in {label}: "
            f"{', '.join(exc.paths)}\n  = hint: move them away, or pass --force\n"
        )
        return EXIT_USAGE
    except EditedByHand as exc:
        sys.stderr.write(
            f"msgen: error: refusing to overwrite generated files edited by hand in {label}: "
            f"{', '.join(exc.paths)}\n  = hint: their bytes differ from the hash in "
            "manifest.json; keep the edits elsewhere, or pass --force\n"
        )
        return EXIT_USAGE
    except OtherSpec as exc:
        sys.stderr.write(
            f"msgen: error: refusing to write {label}: it was compiled from {exc.previous}, "
            f"not {exc.new}, and both name the model `{result.spec.model.name}`\n"
            "  = hint: compile into another folder or rename the model; --force if it is "
            "the same spec, moved\n"
        )
        return EXIT_USAGE
    except InTheWay as exc:
        sys.stderr.write(
            f"msgen: error: cannot write {label}: "
            f"{label if exc.rel == '.' else f'{label}/{exc.rel}'} {exc.why}\n"
            "  = hint: move it away; nothing was written\n"
        )
        return EXIT_USAGE
    except DamagedManifest as exc:
        sys.stderr.write(
            f"msgen: error: cannot write {label}: {exc}\n"
            "  = hint: pass --force to rewrite the folder's generated files\n"
        )
        return EXIT_USAGE
    except OSError as exc:
        sys.stderr.write(f"msgen: error: cannot write {label}: {exc}; nothing was changed\n")
        return EXIT_USAGE
    for note in notes(plan):
        sys.stderr.write(f"note: {note}\n")
    sys.stderr.write(
        f"{label}: {len(change.written)} written, {len(change.unchanged)} unchanged, "
        f"{len(change.removed)} removed\n"
    )
    return EXIT_OK
