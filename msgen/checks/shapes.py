"""Shapes: op arity and argument types were settled by lowering; here every op's
output shape is inferred, operands must agree, and a repeated layer must map
its input shape to itself."""

from __future__ import annotations

from msgen.checks.facts import Facts, GraphFacts, context, graph_of
from msgen.diagnostics import Diagnostic, error
from msgen.ir.models import Spec
from msgen.ops import OPS
from msgen.ops.base import OpError, Param


def op_error(exc: OpError, node) -> Diagnostic:
    span = node.arg_spans.get(exc.at) if exc.at else None
    if exc.at and span is None and exc.at in node.param_shardings:
        span = node.param_shardings[exc.at].span
    if exc.at == "@" and node.out_sharding is not None:
        span = node.out_sharding.span
    return error(exc.code, exc.message, span or node.span, exc.hint)


def run(spec: Spec, facts: Facts) -> list[Diagnostic]:
    diags: list[Diagnostic] = []
    for name in facts.order:
        graph = graph_of(spec, name)
        gf = facts.graphs.setdefault(name, GraphFacts(graph))
        tied: dict[str, Param] = {}
        ctx = context(spec, tied)
        if graph.input is not None:
            gf.shapes[graph.input.name] = graph.input.shape
        for node in graph.ops:
            if any(ref.name not in gf.shapes for ref in node.inputs):
                continue  # an operand failed already
            operands = [gf.shapes[ref.name] for ref in node.inputs]
            if node.kind == "repeat":
                shape = repeat_shape(node, operands[0], facts, diags)
            else:
                try:
                    shape = OPS[node.kind].shape(node, operands, ctx)
                    for pname, pshape in OPS[node.kind].param_shapes(node, operands, ctx).items():
                        if node.kind == "embedding":
                            tied[node.name] = Param(pname, pshape, ())
                except OpError as exc:
                    diags.append(op_error(exc, node))
                    continue
            if shape is not None:
                gf.shapes[node.name] = shape
        if name == "network":
            diags += network_io(spec, gf)
    return diags


def repeat_shape(node, x, facts: Facts, diags) -> tuple[int, ...] | None:
    layer = facts.graphs.get(node.args["layer"])
    if layer is None or layer.graph.input is None:
        return None
    want = layer.graph.input.shape
    if x != want:
        diags.append(
            error(
                "MSL118",
                f"`{node.inputs[0].name}` is {list(x)}, but layer `{layer.graph.name}` takes "
                f"{list(want)}",
                node.inputs[0].span,
            )
        )
        return None
    out = layer.shapes.get(layer.graph.output or "")
    if out is not None and out != want:
        diags.append(
            error(
                "MSL118",
                f"layer `{layer.graph.name}` maps {list(want)} to {list(out)}; a repeated "
                "layer must give back its input's shape",
                layer.graph.output_span or layer.graph.span,
            )
        )
        return None
    return out


def network_io(spec: Spec, gf: GraphFacts) -> list[Diagnostic]:
    graph = spec.network
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
