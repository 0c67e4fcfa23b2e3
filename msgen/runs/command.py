"""`msgen report` and `msgen calibrate`: the run tools' commands.

`msgen report RUN_DIR [--spec SPEC] [--html FILE | --svg FILE] [--json]
[--calibration FILE]` reads a run back. It exits 0 when healthy, 1 when an alarm
fires (a cron job or CI can page on it); a folder with no run, or a spec given with
errors, is a usage error (RunError, exit 2).

`msgen calibrate RUN_DIR... [--spec SPEC] [--fit P,...] [-o FILE [--force]]` fits the
time model to the runs (msgen.runs.calibrate).

`analyze(path, sets)` is the compiler's front end as the command line runs it (printing
the spec's diagnostics). Both apply the `--set` flags the run's tree was compiled with
(run.json's `spec.set`, from the tree's manifest), so that a run is held against the
plan it ran.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from msgen.base.status import EXIT_OK
from msgen.compiler import estimable
from msgen.diagnostics import printable
from msgen.runs import RunError
from msgen.runs.alarms import judge
from msgen.runs.logs import Run, read_run
from msgen.runs.output import run_report
from msgen.runs.summary import compare, predict, summarize
from msgen.runs.text import render

EXIT_ALARM = 1


@dataclass(frozen=True)
class ReportOptions:
    run: Path
    spec: Path | None = None  # default: the spec run.json names, when it is here
    json: bool = False
    html: Path | None = None
    svg: Path | None = None
    calibration: Path | None = None


@dataclass(frozen=True)
class CalibrateOptions:
    runs: tuple[Path, ...]
    spec: Path | None = None  # default: each run's run.json spec
    fit: tuple[str, ...] | None = None  # default: msgen.runs.calibrate.default_parameters
    output: Path | None = None
    force: bool = False  # replace an existing `output`


def spec_named_in(run: Run) -> tuple[Path | None, str | None]:
    """The spec run.json names, when it may be read; else None and, when run.json
    names a file that may not, a note saying so.

    run.json's spec path is as compile was given it (relative to where it ran, or
    absolute); msgen reads it relative to where it runs now. Only a regular file whose
    name ends in `.msl`, links followed, is read, and only through the compiler's front
    end: a run folder from elsewhere cannot make msgen open and quote /etc/passwd, a
    key under ~/.ssh, a FIFO or a device, directly or through a link named x.msl."""
    named = next((p["spec"]["path"] for r in run.ranks if (p := r.provenance)
                  and (p.get("spec") or {}).get("path")), None)  # fmt: skip
    if named is None:
        return None, None
    path = Path(named)
    try:
        if not path.exists():
            return None, None
        target = path.resolve()
        if target.suffix == ".msl" and target.is_file():
            return path, None
    except (OSError, RuntimeError, ValueError):  # a link loop, a NUL byte
        pass
    return None, (
        f"run.json names the spec {printable(named)}, which is not a .msl file: not read "
        "(give --spec to compare)"
    )


def compiled_sets(run: Run) -> tuple[str, ...]:
    """The --set flags the run's tree was compiled with, as its run.json records them."""
    for r in run.ranks:
        sets = ((r.provenance or {}).get("spec") or {}).get("set")
        if isinstance(sets, list) and all(isinstance(s, str) for s in sets):
            return tuple(sets)
    return ()


def prediction(run: Run, options: ReportOptions, analyze):
    """The estimate to hold the run against, or None without a spec, and a note on a
    spec run.json names that is not read. A spec run.json names that has errors leaves
    the report without one; a --spec with errors is a usage error."""
    from msgen.runs.calibrate import calibrated_device

    spec, note = (options.spec, None) if options.spec else spec_named_in(run)
    if spec is None:
        return None, note
    result = analyze(spec, compiled_sets(run))
    if not estimable(result):
        if options.spec is None:
            return None, None
        raise RunError(f"{printable(str(spec))} has errors: nothing to compare the run with")
    device = None
    if options.calibration:
        device = calibrated_device(options.calibration, result.spec.cluster.device)
    return predict(result, device), None


def report_command(options: ReportOptions, analyze) -> int:
    from msgen.base.files import write_output

    run = read_run(options.run)
    predicted, note = prediction(run, options, analyze)
    if note:
        run = replace(run, notes=(*run.notes, note))
    summary = summarize(run, per_step=predicted.tokens_per_step if predicted else None)
    alarms = judge(run)
    comparison = compare(run, summary, predicted) if predicted else None
    report = run_report(run, summary, alarms, comparison)
    text = render(report)
    if options.json:
        sys.stdout.write(json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
    else:
        sys.stdout.write(text)
    if options.html or options.svg:
        from msgen.runs.plots import render_html, render_svg

        spec = options.spec or options.run
        if options.html:
            write_output("--html", str(options.html), spec, render_html(run, report, text))
        else:
            write_output("--svg", str(options.svg), spec, render_svg(run, report))
    return EXIT_OK if report.healthy else EXIT_ALARM


def calibrate_command(options: CalibrateOptions, analyze) -> int:
    from msgen.base.files import write_output
    from msgen.runs.calibrate import calibrate, calibration_json, measured, render

    runs = []
    for folder in options.runs:
        run = read_run(folder)
        spec, note = (options.spec, None) if options.spec else spec_named_in(run)
        if spec is None:
            raise RunError(f"{printable(str(folder))}: {note or 'its run.json names no spec here'}"
                           "; give --spec")  # fmt: skip
        result = analyze(spec, compiled_sets(run))
        if not estimable(result):
            raise RunError(f"{printable(str(spec))} has errors: no time model to fit")
        runs.append(measured(run, result))
    fit = calibrate(runs, options.fit)
    sys.stdout.write(render(fit, runs))
    if options.output:
        if options.output.exists() and not options.force:
            raise RunError(f"-o {printable(str(options.output))} exists; add --force to replace it")
        spec = Path(runs[0].result.file)
        write_output("-o", str(options.output), spec, calibration_json(fit, runs))
    return EXIT_OK
