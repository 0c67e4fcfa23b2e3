"""The elementwise ops' code: activations, dropout, `+` and `*` (msgen/ops/elementwise.py)."""

from __future__ import annotations

from msgen.emit.ops.base import OpEmitter, Snippet, call_args


class Gelu(OpEmitter):
    kind = "gelu"
    helpers = ("gelu",)

    def settings(self, node, ctx):
        return {"approximate": self.arg(node, "approximate")}

    def code(self, op, model):
        (x,) = op.inputs
        if op.setting("approximate"):  # ops.GeLU is the tanh form
            return Snippet(f"ops.GeLU().shard({op.strategy('x')})", f"self.{op.name}({x})")
        return Snippet(f"Gelu({op.strategy('x')})", f"self.{op.name}({x})", "gelu")


class Silu(OpEmitter):
    kind = "silu"

    def code(self, op, model):
        (x,) = op.inputs
        return Snippet(f"SiLU().shard({op.strategy('x')})", f"self.{op.name}({x})")


class Swiglu(OpEmitter):
    kind = "swiglu"
    helpers = ("swiglu",)

    def code(self, op, model):
        (x,) = op.inputs
        return Snippet(f"SwiGLU({op.strategy('kernel')})", f"self.{op.name}({x})", "swiglu")


class Dropout(OpEmitter):
    kind = "dropout"

    def settings(self, node, ctx):
        return {"p": float(self.arg(node, "p"))}

    def code(self, op, model):
        (x,) = op.inputs
        # ops.Dropout returns (output, mask); evaluation (set_train(False)) skips it.
        # Seeded (model.py's dropout_seeds): unseeded, two runs drop different units.
        make = f"ops.Dropout({1.0 - op.setting('p')!r}, *dropout_seeds()).shard({op.strategy('x')})"
        return Snippet(make, f"self.{op.name}({x})[0] if self.training else {x}")


class _Binary(OpEmitter):
    primitive = "Add"

    def code(self, op, model):
        return Snippet(
            f"ops.{self.primitive}().shard({op.strategy('x')})",
            f"self.{op.name}({call_args(*op.inputs)})",
        )


class Add(_Binary):
    kind = "add"


class Mul(_Binary):
    kind = "mul"
    primitive = "Mul"
