"""The facts derived from a spec's graphs, computed once, in order: which graphs
and in what order (`order`), every tensor's shape (`infer_shapes`), every split,
layout, parameter and saved tensor (`infer_layouts`). Validators in msgen.checks
read them. Where a fact cannot be derived (an op given operands it does not take)
the step says so as a diagnostic and leaves the fact out."""

from __future__ import annotations

from math import prod

from msgen.analysis.facts import (
    TOKEN_BYTES,
    Facts,
    GraphFacts,
    OpFacts,
    Redistribution,
    context,
    graph_of,
)
from msgen.diagnostics import Diagnostic, error
from msgen.ir.models import Spec
from msgen.ir.schema import DTYPE_BYTES
from msgen.ops import OPS
from msgen.ops.base import OpError, Param, Tensor, split_factor, whole


def order(spec: Spec, facts: Facts) -> list[Diagnostic]:
    """The graphs in the order they are analysed: each repeated layer (once), then
    the network; a layer repeated twice is MSL121 (parameter paths name the layer)."""
    diags: list[Diagnostic] = []
    for op in spec.network.ops:
        if op.kind != "repeat" or op.args["layer"] not in spec.layers:
            continue
        layer = op.args["layer"]
        if layer in facts.repeats:
            diags.append(
                error(
                    "MSL121",
                    f"layer `{layer}` is already repeated by `{facts.repeats[layer].name}`",
                    op.span,
                    "parameter paths name the layer: repeat each layer once "
                    "(define a second layer block for a second stack)",
                )
            )
            continue
        facts.repeats[layer] = op
        facts.order.append(layer)
    facts.order.append("network")
    return diags


def op_error(exc: OpError, node) -> Diagnostic:
    span = node.arg_spans.get(exc.at) if exc.at else None
    if exc.at and span is None and exc.at in node.param_shardings:
        span = node.param_shardings[exc.at].span
    if exc.at == "@" and node.out_sharding is not None:
        span = node.out_sharding.span
    return error(exc.code, exc.message, span or node.span, exc.hint)


def infer_shapes(spec: Spec, facts: Facts) -> list[Diagnostic]:
    """Every op's output shape; an op whose operands do not fit it is its diagnostic."""
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
                        if OPS[node.kind].tieable:
                            tied[node.name] = Param(pname, pshape, ())
                except OpError as exc:
                    diags.append(op_error(exc, node))
                    continue
            if shape is not None:
                gf.shapes[node.name] = shape
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


def infer_layouts(spec: Spec, facts: Facts) -> list[Diagnostic]:
    """Every tensor's split, every op's layout and parameters, the redistributions
    between producer and consumer, and what each op saves for backward; an op that
    cannot take its operands' splits is its diagnostic."""
    diags: list[Diagnostic] = []
    ctx = context(spec)
    item = DTYPE_BYTES[spec.model.dtype]
    for name in facts.order:
        gf = facts.graphs[name]
        graph = graph_of(spec, name)
        tied: dict[str, Param] = {}
        op_ctx = context(spec, tied)
        if graph.input is not None:
            decl = graph.input
            split = decl.sharding.dims if decl.sharding else whole(len(decl.shape))
            itemsize = TOKEN_BYTES if name == "network" else item
            gf.tensors[decl.name] = Tensor(decl.shape, split, itemsize)
        for node in graph.ops:
            if node.name not in gf.shapes or any(r.name not in gf.tensors for r in node.inputs):
                continue
            of = OpFacts(node, inputs=[gf.tensors[r.name] for r in node.inputs])
            gf.ops[node.name] = of
            shape = gf.shapes[node.name]
            if node.kind == "repeat":
                layer = facts.graphs[node.args["layer"]]
                layer_in = layer.tensors.get(layer.graph.input.name)
                if layer_in is None or layer.output is None:
                    continue
                needed = (layer_in.split,)
                out = layer.output
                count = node.args["count"]
                if out.split != layer_in.split and count > 1:
                    # each copy's output feeds the next copy's input
                    moved = moved_bytes(out, layer_in.split, ctx)
                    if moved:
                        span = layer.graph.output_span or layer.graph.span
                        of.redistributions.append(
                            Redistribution(node.name, f"{layer.graph.name} output",
                                           out.split, layer_in.split, moved, span,
                                           count - 1)
                        )  # fmt: skip
            else:
                opdef = OPS[node.kind]
                try:
                    layout = opdef.layout(node, of.inputs, shape, op_ctx)
                except OpError as exc:
                    diags.append(op_error(exc, node))
                    continue
                of.layout = layout
                needed = layout.inputs
                out = Tensor(shape, layout.output, opdef.output_itemsize or item)
                for p in layout.params:
                    if opdef.tieable:
                        tied[node.name] = p
            of.output = out
            gf.tensors[node.name] = out
            own = {c.operand for c in of.layout.collectives} if of.layout else set()
            for i, (ref, t, need) in enumerate(zip(node.inputs, of.inputs, needed, strict=False)):
                if t.split != need and i not in own:
                    moved = moved_bytes(t, need, ctx)
                    if moved:
                        of.redistributions.append(
                            Redistribution(node.name, ref.name, t.split, need, moved, ref.span)
                        )
            if node.kind != "repeat":
                of.saves = OPS[node.kind].saves(node, of.inputs, out, op_ctx)
    return diags


def moved_bytes(t: Tensor, needed, ctx) -> int:
    """Bytes each device receives to turn split `t.split` into `needed`: what it
    must hold afterwards minus what it already holds of that."""
    size = prod(t.shape) * t.itemsize
    union = tuple(tuple(sorted(set(a) | set(b))) for a, b in zip(t.split, needed, strict=True))
    f_need = prod(split_factor(a, ctx) for a in needed)
    f_union = prod(split_factor(a, ctx) for a in union)
    return max(0, size // f_need - size // f_union)
