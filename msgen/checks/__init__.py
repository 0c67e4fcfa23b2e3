"""The check passes, run in a fixed order; each returns diagnostics and never raises.

names -> shapes -> sharding build on one another (a pass runs only when those
before it found no error); topology, pipeline and train stand alone. The budget
pass is the estimate's (msgen.estimate.budget): msgen.compiler runs it after
these, and the what-ifs run these passes again on each changed spec.

A spec whose lowering reported errors is still checked where the errors do not
reach: a pass runs when none of the blocks it reads had one (`check` promises
every mistake it can find), and says which passes it left out.
"""

from __future__ import annotations

from msgen.analysis import graph
from msgen.analysis.facts import Facts
from msgen.checks import experts, mtp, names, pipeline, shapes, sharding, topology, train
from msgen.diagnostics import Diagnostic, has_errors
from msgen.ir.models import Spec

# Each stage derives facts (msgen.analysis.graph) and then validates them; a stage
# runs only when those before it found no error.
GRAPH_STAGES = (
    (graph.order, names.run),
    (graph.infer_shapes, shapes.run),
    (sharding.declared, experts.run),
    (graph.infer_layouts, sharding.run),
)
STAGE_NAMES = ("names", "shapes", "shardings", "layouts")
INDEPENDENT_PASSES = (topology, pipeline, train, mtp)
# The blocks each pass reads (`layer`: any layer block).
GRAPH_READS = frozenset({"model", "layer", "network", "mesh", "train", "recompute"})
READS = {
    topology: frozenset({"cluster", "mesh"}),
    pipeline: frozenset({"pipeline", "mesh", "network", "model", "train"}),
    train: frozenset({"train", "mesh", "pipeline", "fusion"}),
    mtp: frozenset({"train", "network", "model", "layer"}),
}


def run_checks(spec: Spec) -> tuple[Facts, list[Diagnostic]]:
    """Run every pass in order."""
    facts, diags, _ = checked(spec)
    return facts, diags


def checked(
    spec: Spec, broken: frozenset[str] = frozenset()
) -> tuple[Facts, list[Diagnostic], list[str]]:
    """Run the passes that read none of the `broken` blocks; also the names of those
    left out (a graph stage after one with errors included)."""
    facts = Facts()
    diags: list[Diagnostic] = []
    skipped: list[str] = []
    failed = bool(broken & GRAPH_READS)
    for name, stage in zip(STAGE_NAMES, GRAPH_STAGES, strict=True):
        if failed:
            skipped.append(name)
            continue
        found = [d for step in stage for d in step(spec, facts)]
        diags += found
        failed = has_errors(found)
    for check in INDEPENDENT_PASSES:
        if broken & READS[check]:
            skipped.append(check.__name__.rpartition(".")[2])
            continue
        diags += check.run(spec, facts)
    return facts, diags, skipped
