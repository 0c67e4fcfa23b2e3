"""`msgen report RUN_DIR [--spec SPEC] [--html FILE | --svg FILE] [--json]`: read a
run back. Exit 0 when healthy, 1 when an alarm fires (a cron job or CI can page
on it), 2 on a usage error (no run there, an unreadable spec)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from msgen.runs.alarms import judge
from msgen.runs.logs import read_run
from msgen.runs.output import run_report
from msgen.runs.summary import Prediction, compare, summarize
from msgen.runs.text import render

EXIT_HEALTHY, EXIT_ALARM = 0, 1


@dataclass(frozen=True)
class ReportOptions:
    run: Path
    json: bool = False
    html: Path | None = None
    svg: Path | None = None


def spec_named_in(run) -> Path | None:
    """The spec run.json names (as compile saw it: relative to where it ran), when
    that file is here."""
    for r in run.ranks:
        path = ((r.provenance or {}).get("spec") or {}).get("path")
        if isinstance(path, str) and Path(path).is_file():
            return Path(path)
    return None


def report_command(options: ReportOptions, predict=None) -> int:
    """`predict(run)`: the Prediction to hold the run against, or None (the command
    line analyses the spec: --spec, else the one run.json names)."""
    from msgen.commands.files import write_output

    run = read_run(options.run)
    prediction: Prediction | None = predict(run) if predict else None
    summary = summarize(run, per_step=prediction.tokens_per_step if prediction else None)
    alarms = judge(run)
    comparison = compare(run, summary, prediction) if prediction else None
    report = run_report(run, summary, alarms, comparison)
    text = render(report)
    if options.json:
        sys.stdout.write(json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
    else:
        sys.stdout.write(text)
    if options.html or options.svg:
        from msgen.runs.plots import render_html, render_svg

        if options.html:
            page = render_html(run, report, text)
            write_output("--html", str(options.html), options.run, page)
        else:
            write_output("--svg", str(options.svg), options.run, render_svg(run, report))
    return EXIT_HEALTHY if report.healthy else EXIT_ALARM
