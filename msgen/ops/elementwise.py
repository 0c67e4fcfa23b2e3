"""Elementwise ops: activations, dropout, `+` and `*`."""

from __future__ import annotations

from math import prod

from msgen.ops.base import (
    Arg,
    Layout,
    OpDef,
    OpError,
    Saved,
    Work,
    align,
    factors,
    out_declared,
    saved_operand,
    tensor_bytes,
)


class _Unary(OpDef):
    saves_input = True

    def shape(self, node, inputs, ctx):
        return inputs[0]

    def saves(self, node, inputs, output, ctx):
        return [saved_operand(node.inputs[0].name, inputs[0])] if self.saves_input else []


class Gelu(_Unary):
    name = "gelu"
    args = (Arg("x", "tensor"), Arg("approximate", "bool", False))
    imports = ("from mindspore import nn, ops",)


class Silu(_Unary):
    name = "silu"
    args = (Arg("x", "tensor"),)
    imports = ("from mindspore.ops.auto_generate import SiLU",)


class Swiglu(_Unary):
    """[gate | up] halves of the last dim; out = silu(gate) * up. A split last dim
    splits both halves alike (the producing weight is laid out per shard): a last dim
    split k ways is [gate_0 | up_0 | ... | gate_k-1 | up_k-1], so the code views it as
    [..., k, 2, n / (2k)] and halves the 2, a dim no strategy splits (MindSpore's
    Split, and Swiglu's SwigluInfo, a Softmax in frontend/parallel/ops_info/
    activation_info.h, refuse a split axis), as mindformers' fused path does
    (parallel_core/training_graph/transformer/mlp.py). For k = 1 these are the halves.

    On Ascend one Swiglu kernel (ops/auto_generate/gen_ops_prim.py, `(input, dim=-1)`)
    computes it. Both paths save the input only: SwigluGrad reads dy and x."""

    name = "swiglu"
    args = (Arg("x", "tensor"),)
    imports = (
        "from mindspore import nn, ops",
        "from mindspore.ops.auto_generate import SiLU, Swiglu",
    )
    fused_roles = {"kernel": "Swiglu"}

    def strategies(self, node, layout, ctx):
        x = factors(layout.inputs[0], ctx)
        return (("kernel", (x[:-1] + (x[-1], 1, 1),)),)

    def shape(self, node, inputs, ctx):
        (x,) = inputs
        if not x or x[-1] % 2:
            raise OpError("MSL119", "swiglu needs an even last dim ([gate | up])", "x")
        return x[:-1] + (x[-1] // 2,)


class Dropout(_Unary):
    name = "dropout"
    args = (Arg("x", "tensor"), Arg("p", "float", 0.1, within="[0, 1)"))
    saves_input = False
    imports = ("from mindspore import ops",)

    def scales_only(self, node):
        return True

    def saves(self, node, inputs, output, ctx):
        if not node.args.get("p"):
            return []
        # the mask is made at the output's split, one byte per element
        return [Saved(f"{node.name}.mask", output.shape, output.split, 1, "internal")]

    def work(self, node, inputs, output, ctx):
        (x,) = inputs
        mask = prod(output.shape) if node.args.get("p") else 0  # one byte per element
        return Work(memory_bytes=tensor_bytes(x) + tensor_bytes(output) + mask)


def broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """numpy broadcasting over trailing dims, or None when the shapes disagree."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(reversed(out))


class _Binary(OpDef):
    """`a + b`, `a * b`; a constant operand is an arg `const`, not an input."""

    symbol = "+"
    primitive = "Add"
    imports = ("from mindspore import ops",)

    def shape(self, node, inputs, ctx):
        if len(inputs) == 1:
            return inputs[0]
        out = broadcast(inputs[0], inputs[1])
        if out is None:
            raise OpError(
                "MSL117",
                f"`{self.symbol}` of shapes {list(inputs[0])} and {list(inputs[1])} "
                "does not broadcast",
                None,
                "operands must agree on trailing dims (or be 1 there)",
            )
        return out

    def layout(self, node, inputs, out_shape, ctx):
        widest = max(inputs, key=lambda t: len(t.shape))  # max keeps the first on ties
        out = out_declared(node, len(out_shape)) or align(widest.split, out_shape)
        return Layout(inputs=tuple(align(out, t.shape) for t in inputs), output=out)

    def strategies(self, node, layout, ctx):
        # A constant operand (always the last input) is a scalar tensor: `()`.
        const = ((),) if "const" in node.args else ()
        return (("x", tuple(factors(s, ctx) for s in layout.inputs) + const),)


class Add(_Binary):
    name = "add"
    symbol = "+"
    args = (Arg("a", "tensor"), Arg("b", "tensor"))

    def residual_join(self, node):
        return len(node.inputs) == 2  # `x + 1.0` adds no branch

    def backward_work(self, node, forward):
        return Work()  # the gradient passes to both operands as it is


class Mul(_Binary):
    name = "mul"
    symbol = "*"
    primitive = "Mul"
    args = (Arg("a", "tensor"), Arg("b", "tensor"))

    def scales_only(self, node):
        return len(node.inputs) == 1  # times a constant; `act * up` is a gate

    def saves(self, node, inputs, output, ctx):
        if len(inputs) < 2:
            return []  # times a constant: backward needs only the constant
        return [saved_operand(ref.name, t) for ref, t in zip(node.inputs, inputs, strict=True)]
