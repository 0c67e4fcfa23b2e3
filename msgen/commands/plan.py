"""`msgen plan SPEC [--top K] [--json] [--objective time|memory] [--write FILE [--pick N]
[--force]]`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from msgen.commands.files import write_output
from msgen.commands.status import EXIT_ERRORS, EXIT_OK, UsageError, estimable
from msgen.estimate.plan_report import describe, render, search_json
from msgen.estimate.planner import Ranked, search
from msgen.syntax import read_source
from msgen.syntax.edit import write_settings
from msgen.syntax.fmt import format_text


@dataclass(frozen=True)
class PlanOptions:
    spec: Path
    top: int = 5
    json: bool = False
    objective: str = "time"
    write: Path | None = None  # save plan `pick` (from 1) as a spec here
    pick: int = 1
    force: bool = False  # replace an existing `write`
    device: object | None = None  # the spec's device as calibrated (`--calibration`)


def plan_command(result, options: PlanOptions) -> int:
    if not estimable(result):
        return EXIT_ERRORS
    if options.top < 1:
        raise UsageError("--top must be at least 1")
    if options.pick < 1:
        raise UsageError("--pick must be at least 1")
    found = search(
        result.spec,
        result.facts,
        options.objective,
        max(options.top, options.pick),
        options.device,
    )
    shown = replace(found, plans=found.plans[: options.top])
    if options.json:
        sys.stdout.write(json.dumps(search_json(shown, options.objective), indent=2) + "\n")
    else:
        sys.stdout.write(render(shown, result.spec.model.name, options.objective))
    if options.write is not None and found.plans:
        if options.pick > len(found.plans):
            raise UsageError(f"--pick {options.pick}: only {len(found.plans)} plans fit")
        write_plan(options.spec, options.write, found.plans[options.pick - 1], options.force)
    return EXIT_OK if found.plans else EXIT_ERRORS


def write_plan(spec: Path, out: Path, plan: Ranked, force: bool) -> None:
    """The spec with the plan's settings written in, laid out as `msgen fmt` does, into
    `out`: never the spec itself, and an existing file only with --force."""
    if out.exists() and not force and not (spec.exists() and out.samefile(spec)):
        raise UsageError(f"--write {out} exists; add --force to replace it")
    text = read_source(spec)
    formatted, _ = format_text(write_settings(text, list(plan.layout.sets), str(spec)), str(out))
    write_output("--write", str(out), spec, formatted)
    print(f"wrote {describe(plan)} to {out}", file=sys.stderr)
