"""Shapes: op arity and argument types were settled by lowering, and every op's
shape inferred by msgen.analysis.graph (operands that disagree, or a repeated
layer that does not map its input shape to itself, are reported there); here the
network takes token ids and ends in a scalar loss."""

from __future__ import annotations

from msgen.analysis.facts import Facts
from msgen.diagnostics import Diagnostic, error
from msgen.ir.models import Spec


def run(spec: Spec, facts: Facts) -> list[Diagnostic]:
    graph = spec.network
    gf = facts.graphs.get("network")
    if gf is None:
        return []
    diags = []
    if graph.input is not None and len(graph.input.shape) != 2:
        diags.append(
            error(
                "MSL117",
                f"the network's input is token ids [batch, seq], not {list(graph.input.shape)}",
                graph.input.span,
            )
        )
    out = gf.shapes.get(graph.output or "")
    if out is not None and out != ():
        diags.append(
            error(
                "MSL117",
                f"the network's output is the loss, a scalar; this one is {list(out)}",
                graph.output_span or graph.span,
                "end the network with `output cross_entropy(logits, tokens)`",
            )
        )
    return diags
