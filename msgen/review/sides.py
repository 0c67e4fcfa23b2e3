"""One side of a diff: the spec through the compiler's one entry point, then what
`msgen estimate --json` and `msgen compile` make of it, by their own code."""

from __future__ import annotations

import json
from dataclasses import dataclass

from msgen.analysis.plan import build_plan
from msgen.compiler import Result, estimable
from msgen.emit import emit
from msgen.emit.build import build_context
from msgen.emit.context import ModelContext
from msgen.estimate.memory import estimate
from msgen.estimate.output import estimate_report
from msgen.estimate.time import step_time
from msgen.review.model import Message, SideReport


@dataclass(frozen=True)
class Side:
    label: str
    result: Result
    estimate: dict | None = None
    """`msgen estimate --json` of the spec, when it can be estimated."""
    files: dict[str, str] | None = None
    """What `msgen compile` would write, by relative path."""
    context: ModelContext | None = None
    """The strategies and recompute marks model.py is rendered from."""

    @property
    def status(self) -> str:
        if self.result.ok:
            return "ok"
        return "over budget" if self.estimate is not None else "errors"

    @property
    def plan(self) -> dict | None:
        """The side's plan.json."""
        return json.loads(self.files["plan.json"]) if self.files else None

    def report(self) -> SideReport:
        diags = sorted(
            self.result.diagnostics,
            key=lambda d: (d.span.line if d.span else 0, d.span.col if d.span else 0, d.code),
        )
        return SideReport(
            label=self.label,
            status=self.status,
            diagnostics=[
                Message(
                    code=d.code,
                    severity=d.severity.value,
                    message=d.message,
                    line=d.span.line if d.span else None,
                )
                for d in diags
            ],
        )


def load_side(label: str, result: Result, spec_path: str) -> Side:
    """`spec_path` names the spec in the generated headers; both sides of a diff are
    emitted under NEW's, so a renamed spec does not change every file."""
    if not estimable(result):
        return Side(label, result)
    plan = build_plan(result.spec, result.facts)
    est = estimate(plan)
    report = estimate_report(est, step_time(plan, est)).model_dump(mode="json")
    # a spec over budget still has a tree, though compile refuses to write it
    return Side(label, result, report, emit(plan, spec_path), build_context(plan, spec_path))
