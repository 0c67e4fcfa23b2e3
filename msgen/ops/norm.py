"""`layernorm(x, eps)` and `rmsnorm(x, eps)`: normalise over the last dim."""

from __future__ import annotations

from msgen.ops.base import (
    Arg,
    Layout,
    OpDef,
    OpError,
    Param,
    Snippet,
    declared,
    factors,
    out_declared,
    replace_last,
    saved_operand,
)


class _Norm(OpDef):
    weights: tuple[str, ...] = ()
    cell = ""  # the helper cell's class

    def settings(self, node, ctx):
        return {"eps": float(self.arg(node, "eps"))}

    def code(self, op, model):
        (x,) = op.inputs
        (hidden,) = op.params[0].shape
        make = f"{self.cell}({hidden}, eps={op.setting('eps')!r}, norm={op.strategy('norm')})"
        return Snippet(make, f"self.{op.name}({x})", self.name)

    def shape(self, node, inputs, ctx):
        (x,) = inputs
        if not x:
            raise OpError("MSL116", f"{self.name} needs a tensor with at least one dim", "x")
        return x

    def param_shapes(self, node, inputs, ctx):
        return {w: (inputs[0][-1],) for w in self.weights}

    def layout(self, node, inputs, out_shape, ctx):
        (x,) = inputs
        # statistics need the whole last dim: a split there is gathered first
        out = replace_last(out_declared(node, len(out_shape)) or x.split, ())
        params = []
        for w in self.weights:
            split = declared(node, w, 1)
            if split != ((),):
                raise OpError(
                    "MSL210",
                    f"`{w}` of {self.name} `{node.name}` cannot be split: the op needs the "
                    "whole last dim",
                    w,
                    f"drop `{w} @ [...]`",
                )
            params.append(Param(w, (x.shape[-1],), split))
        return Layout(inputs=(out,), output=out, params=tuple(params))

    def saves(self, node, inputs, output, ctx):
        return [saved_operand(node.inputs[0].name, inputs[0])]


class LayerNorm(_Norm):
    name = "layernorm"
    args = (Arg("x", "tensor"), Arg("eps", "float", 1e-5, within="(0, inf)"))
    params = ("gamma", "beta")
    weights = ("gamma", "beta")
    inits = {"gamma": "ones", "beta": "zeros"}
    helpers = ("layernorm",)
    imports = ("from mindspore import nn, ops",)
    cell = "LayerNorm"

    def strategies(self, node, layout, ctx):
        return (("norm", (factors(layout.inputs[0], ctx), (1,), (1,))),)


class RmsNorm(_Norm):
    name = "rmsnorm"
    args = (Arg("x", "tensor"), Arg("eps", "float", 1e-6, within="(0, inf)"))
    params = ("gamma",)
    weights = ("gamma",)
    inits = {"gamma": "ones"}
    helpers = ("rmsnorm",)
    imports = ("from mindspore import nn, ops", "from mindspore.common import dtype as mstype")
    cell = "RMSNorm"

    def strategies(self, node, layout, ctx):
        return (("norm", (factors(layout.inputs[0], ctx),)),)
