"""The check passes, run in a fixed order; each returns diagnostics and never raises.

names -> shapes -> sharding build on one another (a pass runs only when those
before it found no error); topology, pipeline and train stand alone.
"""

from __future__ import annotations

from msgen.checks import names, pipeline, shapes, sharding, topology, train
from msgen.checks.facts import Facts
from msgen.diagnostics import Diagnostic, has_errors
from msgen.ir.models import Spec

GRAPH_PASSES = (names, shapes, sharding)
INDEPENDENT_PASSES = (topology, pipeline, train)


def run_checks(spec: Spec) -> tuple[Facts, list[Diagnostic]]:
    facts = Facts()
    diags: list[Diagnostic] = []
    for check in GRAPH_PASSES:
        found = check.run(spec, facts)
        diags += found
        if has_errors(found):
            break
    for check in INDEPENDENT_PASSES:
        diags += check.run(spec, facts)
    return facts, diags
