"""`linear`'s code (msgen/ops/linear.py): a Linear cell, or a TiedLinear reading its
embedding's table."""

from __future__ import annotations

from msgen.emit.ops.base import OpEmitter, Snippet


class Linear(OpEmitter):
    kind = "linear"
    helpers = ("linear", "tied_linear")

    def settings(self, node, ctx):
        return {"bias": self.arg(node, "bias"), "tie": self.arg(node, "tie")}

    def code(self, op, model):
        (x,) = op.inputs
        matmul = op.strategy("matmul")
        if op.setting("tie") is not None:
            return Snippet(
                f"TiedLinear(matmul={matmul})",
                f"self.{op.name}({x}, self.{op.setting('tie')}.table)",
                "tied_linear",
            )
        n_in, n_out = op.params[0].shape
        bias = f", bias={op.strategy('bias')}" if op.setting("bias") else ""
        std = op.setting("std")  # an output projection's scaled init (None: 0.02)
        std = f", std={std!r}" if std is not None else ""
        return Snippet(
            f"Linear({n_in}, {n_out}, matmul={matmul}{bias}{std})",
            f"self.{op.name}({x})",
            "linear",
        )
