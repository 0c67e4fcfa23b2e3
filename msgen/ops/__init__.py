"""The op library: one class per op, looked up by the name a spec calls it by."""

from msgen.ops.attention import Attention
from msgen.ops.base import OpDef
from msgen.ops.elementwise import Add, Dropout, Gelu, Mul, Silu, Swiglu
from msgen.ops.embedding import Embedding, Positions
from msgen.ops.linear import Linear
from msgen.ops.loss import CrossEntropy
from msgen.ops.norm import LayerNorm, RmsNorm

OPS: dict[str, OpDef] = {
    op.name: op
    for op in (
        Embedding(),
        Positions(),
        Linear(),
        Attention(),
        LayerNorm(),
        RmsNorm(),
        Gelu(),
        Silu(),
        Swiglu(),
        Dropout(),
        Add(),
        Mul(),
        CrossEntropy(),
    )
}

# Written as operators, not called by name.
OPERATORS = {"+": "add", "*": "mul"}
CALLABLE = sorted(name for name in OPS if name not in OPERATORS.values())

__all__ = ["OPS", "OPERATORS", "CALLABLE", "OpDef"]
