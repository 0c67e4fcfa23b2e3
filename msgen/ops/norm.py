"""`layernorm(x, eps)` and `rmsnorm(x, eps)`: normalise over the last dim."""

from __future__ import annotations

from msgen.ops.base import (
    Arg,
    Layout,
    OpDef,
    OpError,
    Param,
    declared,
    factors,
    out_declared,
    replace_last,
    saved_operand,
)


class _Norm(OpDef):
    weights: tuple[str, ...] = ()
    cell = ""  # the helper cell's class

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
        # Backward reads the input (and per-row statistics, too small to count). The
        # fused RmsNorm saves the same: RmsNormGrad takes dy, x, rstd and gamma (the
        # kernel's rstd output, [rows, 1] fp32), so both paths keep x.
        return [saved_operand(node.inputs[0].name, inputs[0])]


class LayerNorm(_Norm):
    name = "layernorm"
    args = (Arg("x", "tensor"), Arg("eps", "float", 1e-5, within="(0, inf)"))
    params = ("gamma", "beta")
    weights = ("gamma", "beta")
    inits = {"gamma": "ones", "beta": "zeros"}
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
    # RmsNorm(epsilon)(x, gamma) -> (y, rstd): ops/auto_generate/gen_ops_prim.py (2.10)
    imports = (
        "from mindspore import nn, ops",
        "from mindspore.common import dtype as mstype",
        "from mindspore.ops.auto_generate import RmsNorm",
    )
    cell = "RMSNorm"
    fused_roles = {"kernel": "RmsNorm"}

    def strategies(self, node, layout, ctx):
        x = factors(layout.inputs[0], ctx)
        # The kernel's x is whole from the normalised dim on and gamma whole, as
        # RmsNormInfo::CheckStrategy requires (frontend/parallel/ops_info/rms_norm_info.cc).
        return (("norm", (x,)), ("kernel", (x, (1,))))
