"""The check passes, run in a fixed order; each returns diagnostics and never raises.

names -> shapes -> sharding build on one another (a pass runs only when those
before it found no error); topology, pipeline and train stand alone. The budget
pass is the estimate's (msgen.estimate.budget): msgen.compiler runs it after
these, and the what-ifs run these passes again on each changed spec.
"""

from __future__ import annotations

from msgen.analysis import graph
from msgen.analysis.facts import Facts
from msgen.checks import evaluation, names, pipeline, shapes, sharding, topology, train
from msgen.diagnostics import Diagnostic, has_errors
from msgen.ir.models import Spec

# Each stage derives facts (msgen.analysis.graph) and then validates them; a stage
# runs only when those before it found no error.
GRAPH_STAGES = (
    (graph.order, names.run),
    (graph.infer_shapes, shapes.run),
    (sharding.declared,),
    (graph.infer_layouts, sharding.run),
)
INDEPENDENT_PASSES = (topology, pipeline, train, evaluation)


def run_checks(spec: Spec) -> tuple[Facts, list[Diagnostic]]:
    """Run every pass in order."""
    facts = Facts()
    diags: list[Diagnostic] = []
    for stage in GRAPH_STAGES:
        found = [d for step in stage for d in step(spec, facts)]
        diags += found
        if has_errors(found):
            break
    for check in INDEPENDENT_PASSES:
        diags += check.run(spec, facts)
    return facts, diags
