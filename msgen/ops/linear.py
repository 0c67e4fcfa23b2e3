"""`linear(x, n, bias = true, tie = T)`: maps the last dim to n with weight [in, n]."""

from __future__ import annotations

import dataclasses
from math import prod

from msgen.ops.base import (
    Arg,
    Collective,
    Layout,
    OpDef,
    OpError,
    Param,
    declared,
    factors,
    lead,
    matmul,
    out_declared,
    partial_sum,
    replace_last,
    saved_operand,
)


def without(split, axes):
    """Drop from every dim the axes another operand already uses (an all-gather)."""
    used = set(axes)
    return tuple(tuple(a for a in s if a not in used) for s in split)


class Linear(OpDef):
    name = "linear"
    args = (Arg("x", "tensor"), Arg("n", "int"), Arg("bias", "bool", True), Arg("tie", "op", None))
    params = ("weight", "bias")
    imports = ("from mindspore import nn, ops",)
    inits = {"weight": "normal", "bias": "zeros"}
    decays = frozenset({"weight"})
    output_layer = True

    def strategies(self, node, layout, ctx):
        x = layout.inputs[0]
        rows, w_in = lead(x, ctx), factors(x, ctx)[-1]
        out = factors(layout.output, ctx)
        if node.args.get("tie"):
            tv, th = factors(ctx.tied[node.args["tie"]].split, ctx)
            return (("matmul", ((rows, th), (tv, th))),)
        w = {p.name: factors(p.split, ctx) for p in layout.params}
        roles = [("matmul", ((rows, w_in), w["weight"]))]
        if "bias" in w:
            roles.append(("bias", ((prod(out[:-1]), out[-1]), w["bias"])))
        return tuple(roles)

    def shape(self, node, inputs, ctx):
        (x,) = inputs
        if not x:
            raise OpError("MSL116", "linear needs a tensor with at least one dim", "x")
        tie = node.args.get("tie")
        if tie:
            table = ctx.tied.get(tie)
            if table is None:
                raise OpError(
                    "MSL123",
                    f"`tie = {tie}` must name an embedding op",
                    "tie",
                    "tie the output layer to the op that owns the table, e.g. `tie = emb`",
                )
            if table.shape != (node.args["n"], x[-1]):
                raise OpError(
                    "MSL119",
                    f"tied table {tie}.table is {list(table.shape)}, but this layer maps "
                    f"{x[-1]} -> {node.args['n']}",
                    "tie",
                )
        return x[:-1] + (node.args["n"],)

    def param_shapes(self, node, inputs, ctx):
        if node.args.get("tie"):
            return {}
        (x,) = inputs
        shapes = {"weight": (x[-1], node.args["n"])}
        if node.args.get("bias", True):
            shapes["bias"] = (node.args["n"],)
        return shapes

    def layout(self, node, inputs, out_shape, ctx):
        (x,) = inputs
        tie = node.args.get("tie")
        if tie:
            tv, th = ctx.tied[tie].split
            w_in, w_out = th, tv  # the table [vocab, hidden] used transposed
        elif "weight" in node.param_shardings:
            w_in, w_out = declared(node, "weight", 2)
        else:
            w_in, w_out = x.split[-1], ()
        if x.split[-1] and w_in and x.split[-1] != w_in:
            raise OpError(
                "MSL206",
                f"the reduction dim of `{node.name}` is split over {_axes(x.split[-1])} in "
                f"its input but over {_axes(w_in)} in its weight",
                "weight",
                "split the weight's input dim like the input's last dim (row parallel), "
                "or leave one of them whole",
            )
        need_x = replace_last(without(x.split[:-1] + ((),), w_in + w_out), w_in)
        out = out_declared(node, len(out_shape)) or replace_last(need_x, w_out)
        # Sequence parallelism: a leading dim split over the weight's axes is
        # all-gathered in front of the matmul, as Megatron's column-parallel linear does.
        gathered = tuple(
            sorted({a for have, need in zip(x.split[:-1], need_x[:-1], strict=True)
                    for a in have if a not in need})
        )  # fmt: skip
        params = ()
        if not tie:
            params = (Param("weight", (x.shape[-1], node.args["n"]), (w_in, w_out)),)
            if node.args.get("bias", True):
                params += (Param("bias", (node.args["n"],), (() if w_in else w_out,)),)
        collectives = partial_sum(out, w_in, prod(out_shape), "output")
        if gathered:
            gather = Collective("AllGather", gathered, prod(x.shape), "input", operand=0)
            collectives = (gather,) + collectives
        return Layout(inputs=(need_x,), output=out, params=params, collectives=collectives)

    def saves(self, node, inputs, output, ctx):
        return [saved_operand(node.inputs[0].name, inputs[0])]

    def backward_collectives(self, node, inputs, layout, ctx):
        """The input gradient dY . W^T sums over the output dim: split over the
        weight's output axes (column parallel) it is a partial sum, all-reduced,
        or reduce-scattered back to the sequence split the forward gathered from,
        after gathering the saved (split) input again for the weight gradient, as
        Megatron's sequence parallelism does. A forward ReduceScatter (row
        parallel under sequence parallelism) gathers the output gradient."""
        (x,) = inputs
        elements = prod(x.shape)
        w_out = layout.output[-1]
        gathered = [c for c in layout.collectives if c.operand == 0]
        out = []
        for g in gathered:
            out += [g, Collective("ReduceScatter", g.axes, elements, "input gradient")]
        if w_out and not gathered:
            out.append(Collective("AllReduce", w_out, elements, "input gradient"))
        for c in layout.collectives:
            if c.kind == "ReduceScatter":
                gather = Collective("AllGather", c.axes, c.elements, "output gradient")
                out.append(dataclasses.replace(gather, blocking=True))
        return tuple(out)

    def work(self, node, inputs, output, ctx):
        # [rows, in] x [in, n]; the bias add is fused into the matmul
        (x,) = inputs
        return matmul(2 * prod(x.shape) * node.args["n"])


def _axes(axes) -> str:
    return "*".join(axes) or "1"
