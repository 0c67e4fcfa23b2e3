"""`msgen plan SPEC [--top K] [--json] [--objective time|memory] [--set K=V ...]
[--write FILE [--pick N] [--force]]`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from msgen.base.files import write_output
from msgen.base.status import EXIT_ERRORS, EXIT_OK, UsageError
from msgen.compiler import estimable
from msgen.estimate.plan_report import describe, render, search_json
from msgen.estimate.planner import Ranked, search
from msgen.ir.rederive import DEVICES_KEY
from msgen.syntax import read_source
from msgen.syntax.edit import rebased, write_settings
from msgen.syntax.fmt import format_text
from msgen.syntax.overrides import override_keys


@dataclass(frozen=True)
class PlanOptions:
    spec: Path
    top: int = 5
    json: bool = False
    objective: str = "time"
    write: Path | None = None  # save plan `pick` (from 1) as a spec here
    pick: int | None = None  # None: the first, if it keeps the headroom
    force: bool = False  # replace an existing `write`
    sets: tuple[str, ...] = ()  # --set: the spec searched from; their keys are pinned
    device: object | None = None  # the spec's device as calibrated (`--calibration`)


def plan_command(result, options: PlanOptions) -> int:
    if not estimable(result):
        return EXIT_ERRORS
    if options.top < 1:
        raise UsageError("--top must be at least 1")
    if options.pick is not None and options.pick < 1:
        raise UsageError("--pick must be at least 1")
    given = override_keys(list(options.sets))
    if options.write is not None and DEVICES_KEY in given:
        raise UsageError(
            f"--write: --set {DEVICES_KEY} makes up the added servers' addresses; list "
            "every server in the spec's cluster.nodes, then plan and --write"
        )
    pick = options.pick or 1
    found = search(
        result.spec,
        result.facts,
        options.objective,
        max(options.top, pick),
        options.sets,
        options.device,
    )
    shown = replace(found, plans=found.plans[: options.top])
    if options.json:
        sys.stdout.write(
            json.dumps(search_json(shown, options.objective, result.spec), indent=2) + "\n"
        )
    else:
        sys.stdout.write(render(shown, result.spec, options.objective))
    if options.write is not None and found.plans:
        if pick > len(found.plans):
            raise UsageError(f"--pick {pick}: only {len(found.plans)} plans fit")
        chosen = found.plans[pick - 1]
        if options.pick is None and not chosen.headroom_kept:
            raise UsageError(
                "--write: no plan keeps the 10% fragmentation headroom, so `check` would "
                "warn MSL402 on the spec written; choose one anyway with --pick N"
            )
        write_plan(options.spec, options.write, chosen, options.force, found.flags(chosen))
    return EXIT_OK if found.plans else EXIT_ERRORS


def write_plan(spec: Path, out: Path, plan: Ranked, force: bool, flags: tuple[str, ...]) -> None:
    """The spec with the plan's `--set` flags written in (msgen.estimate.planner's
    Search.flags: the search's fixed values, then the layout's), and the
    paths it reads rebased to `out`'s folder (msgen.syntax.edit), laid out as `msgen fmt`
    does, into `out`: never the spec itself, and an existing file only with --force."""
    if out.exists() and not force and not (spec.exists() and out.samefile(spec)):
        raise UsageError(f"--write {out} exists; add --force to replace it")
    text = read_source(spec)
    try:
        edited = write_settings(text, list(flags), str(spec), rebased(spec.parent, out.parent))
    except ValueError as exc:
        raise UsageError(f"--write {out}: {exc}") from exc
    formatted, diags = format_text(edited, str(out))
    if formatted is None:  # never write what does not parse
        message = diags[0].message if diags else "it does not parse"
        raise UsageError(f"--write {out}: the spec with the plan's settings is wrong ({message})")
    write_output("--write", str(out), spec, formatted)
    print(f"wrote {describe(plan)} to {out}", file=sys.stderr)
