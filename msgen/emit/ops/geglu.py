"""`geglu`'s code (msgen/ops/geglu.py)."""

from __future__ import annotations

from msgen.emit.ops.base import OpEmitter, Snippet


class Geglu(OpEmitter):
    kind = "geglu"
    helpers = ("geglu",)

    def code(self, op, model):
        (x,) = op.inputs
        return Snippet(f"GeGLU({op.strategy('x')})", f"self.{op.name}({x})", "geglu")
