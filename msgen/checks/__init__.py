"""The check passes, run in a fixed order; each returns diagnostics and never raises.

names -> shapes -> sharding build on one another (a pass runs only when those
before it found no error); topology, pipeline and train stand alone. The budget
pass runs last, and only on a spec with no error so far: the estimate needs
the graph's layouts, a valid pipeline and known device, and the changes it
suggests are checked by running these passes again on the changed spec.
"""

from __future__ import annotations

from msgen.checks import budget as budget_pass
from msgen.checks import names, pipeline, shapes, sharding, topology, train
from msgen.checks.facts import Facts
from msgen.diagnostics import Diagnostic, has_errors
from msgen.ir.models import Spec

GRAPH_PASSES = (names, shapes, sharding)
INDEPENDENT_PASSES = (topology, pipeline, train)


def run_checks(spec: Spec, budget: bool = True) -> tuple[Facts, list[Diagnostic]]:
    """Run every pass; `budget = False` leaves out the budget pass (what-if
    estimates check their variants that way)."""
    facts = Facts()
    diags: list[Diagnostic] = []
    for check in GRAPH_PASSES:
        found = check.run(spec, facts)
        diags += found
        if has_errors(found):
            break
    for check in INDEPENDENT_PASSES:
        diags += check.run(spec, facts)
    if budget and not has_errors(diags):
        diags += budget_pass.run(spec, facts)
    return facts, diags
