"""`msgen plan SPEC [--top K] [--json] [--objective time|memory]`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from msgen.commands.status import EXIT_ERRORS, EXIT_OK, UsageError, estimable
from msgen.estimate.plan_report import render, search_json
from msgen.estimate.planner import search


@dataclass(frozen=True)
class PlanOptions:
    top: int = 5
    json: bool = False
    objective: str = "time"


def plan_command(result, options: PlanOptions) -> int:
    if not estimable(result):
        return EXIT_ERRORS
    if options.top < 1:
        raise UsageError("--top must be at least 1")
    found = search(result.spec, result.facts, options.objective, options.top)
    if options.json:
        sys.stdout.write(json.dumps(search_json(found, options.objective), indent=2) + "\n")
    else:
        sys.stdout.write(render(found, result.spec.model.name, options.objective))
    return EXIT_OK if found.plans else EXIT_ERRORS
