"""`msgen estimate SPEC [--json] [--svg FILE] [--set K=V]`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from msgen.analysis.plan import Plan
from msgen.base.files import write_output
from msgen.base.status import EXIT_ERRORS, EXIT_OK
from msgen.compiler import estimable
from msgen.diagnostics import has_errors
from msgen.estimate.memory import estimate
from msgen.estimate.output import estimate_report
from msgen.estimate.report import render_text
from msgen.estimate.time import step_time
from msgen.estimate.time_report import moe_validation, render_time


@dataclass(frozen=True)
class EstimateOptions:
    spec: Path
    json: bool = False
    svg: str | None = None  # a file name, or `-` for stdout
    overrides: tuple[str, ...] = ()
    device: object | None = None  # the spec's device as calibrated (`--calibration`)


def write_svg(name: str, spec: Path, svg: str) -> None:
    """`--svg FILE`: a regular file (created or replaced), never the spec itself; `-`
    is stdout."""
    if name == "-":
        sys.stdout.write(svg)
        return
    write_output("--svg", name, spec, svg)


def estimate_command(result, options: EstimateOptions) -> int:
    """Print the whole estimate; 1 when a stage is over budget (or the spec has
    other errors, already printed: then nothing is estimated)."""
    if not estimable(result):
        return EXIT_ERRORS
    plan = Plan(result.spec, result.facts)
    est = estimate(plan)
    timing = step_time(plan, est, options.device)
    moe = moe_validation(result.spec, result.spec.mesh.ep, result.spec.mesh.tp)
    if options.json:
        report = estimate_report(est, timing, moe).model_dump(mode="json")
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(
            render_text(est, list(options.overrides), render_time(timing, moe) if timing else ())
        )
    if options.svg:
        from msgen.estimate.svg import render_svg

        write_svg(options.svg, options.spec, render_svg(est, timing, moe))
    # a budget the device cannot give (MSL403) fails though every stage fits it
    return EXIT_OK if est.fits and not has_errors(result.diagnostics) else EXIT_ERRORS
