"""`geglu(x)`: the GLU variant of Shazeer (2020), "GLU Variants Improve Transformer":
[gate | up] halves of the last dim, out = gelu(gate) * up with the exact (erf) GELU.
A split last dim splits both halves alike, as for swiglu."""

from __future__ import annotations

from msgen.ops.base import Arg, OpDef, OpError, saved_operand


class Geglu(OpDef):
    name = "geglu"
    args = (Arg("x", "tensor"),)
    imports = ("from mindspore import nn, ops",)

    def shape(self, node, inputs, ctx):
        (x,) = inputs
        if not x or x[-1] % 2:
            raise OpError("MSL119", "geglu needs an even last dim ([gate | up])", "x")
        return x[:-1] + (x[-1] // 2,)

    def saves(self, node, inputs, output, ctx):
        # backward needs gelu'(gate) and up: the input, whichever the recompute mode
        return [saved_operand(node.inputs[0].name, inputs[0])]
