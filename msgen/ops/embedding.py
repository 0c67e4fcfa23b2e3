"""`embedding(tokens, vocab, hidden)` and learned `positions(seq, hidden)`."""

from __future__ import annotations

from math import prod

from msgen.ops.base import (
    Arg,
    Layout,
    OpDef,
    Param,
    Saved,
    Work,
    declared,
    factors,
    out_declared,
    partial_sum,
    tensor_bytes,
)
from msgen.ops.linear import without


class Embedding(OpDef):
    name = "embedding"
    args = (Arg("tokens", "tensor"), Arg("vocab", "int"), Arg("hidden", "int"))
    params = ("table",)
    imports = ("from mindspore import nn, ops",)
    inits = {"table": "normal"}
    decays = frozenset({"table"})
    tieable = True

    def strategies(self, node, layout, ctx):
        table = factors(layout.params[0].split, ctx)
        return (("gather", (table, factors(layout.inputs[0], ctx))),)

    def shape(self, node, inputs, ctx):
        return inputs[0] + (node.args["hidden"],)

    def param_shapes(self, node, inputs, ctx):
        return {"table": (node.args["vocab"], node.args["hidden"])}

    def layout(self, node, inputs, out_shape, ctx):
        (tokens,) = inputs
        tv, th = declared(node, "table", 2)
        need = without(tokens.split, tv + th)
        out = out_declared(node, len(out_shape)) or need + (th,)
        table = Param("table", (node.args["vocab"], node.args["hidden"]), (tv, th))
        collectives = partial_sum(out, tv, prod(out_shape), "output")
        return Layout(inputs=(need,), output=out, params=(table,), collectives=collectives)

    def saves(self, node, inputs, output, ctx):
        (tokens,) = inputs
        # token ids are int32 whatever the compute dtype
        return [Saved(node.inputs[0].name, tokens.shape, tokens.split, 4, "input")]

    def work(self, node, inputs, output, ctx):
        # a gather: read the token ids and the rows they pick, write the rows
        (tokens,) = inputs
        return Work(memory_bytes=tensor_bytes(tokens) + 2 * tensor_bytes(output))


class Positions(OpDef):
    name = "positions"
    args = (Arg("seq", "int"), Arg("hidden", "int"))
    params = ("table",)
    imports = ("from mindspore import nn, ops",)
    inits = {"table": "normal"}
    decays = frozenset({"table"})

    def strategies(self, node, layout, ctx):
        return ()

    def shape(self, node, inputs, ctx):
        return (node.args["seq"], node.args["hidden"])

    def param_shapes(self, node, inputs, ctx):
        return {"table": (node.args["seq"], node.args["hidden"])}

    def layout(self, node, inputs, out_shape, ctx):
        split = declared(node, "table", 2)
        table = Param("table", out_shape, split)
        return Layout(inputs=(), output=out_declared(node, 2) or split, params=(table,))
