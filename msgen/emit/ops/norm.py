"""`layernorm` and `rmsnorm`'s code (msgen/ops/norm.py)."""

from __future__ import annotations

from msgen.emit.ops.base import OpEmitter, Snippet, strategy_keywords


class _Norm(OpEmitter):
    cell = ""  # the helper cell's class

    def settings(self, node, ctx):
        return {"eps": float(self.arg(node, "eps"))}

    def code(self, op, model):
        (x,) = op.inputs
        (hidden,) = op.params[0].shape
        kernels = strategy_keywords(op, self.op.fused_roles)
        make = f"{self.cell}({hidden}, eps={op.setting('eps')!r}, norm={op.strategy('norm')}"
        return Snippet(f"{make}{kernels})", f"self.{op.name}({x})", self.kind)


class LayerNorm(_Norm):
    kind = "layernorm"
    helpers = ("layernorm",)
    cell = "LayerNorm"


class RmsNorm(_Norm):
    kind = "rmsnorm"
    helpers = ("rmsnorm",)
    cell = "RMSNorm"
