"""`embedding` and `positions`' code (msgen/ops/embedding.py)."""

from __future__ import annotations

from msgen.emit.ops.base import OpEmitter, Snippet, call_args


class Embedding(OpEmitter):
    kind = "embedding"
    helpers = ("embedding",)

    def code(self, op, model):
        (table,) = op.params
        vocab, hidden = table.shape
        return Snippet(
            f"Embedding({vocab}, {hidden}, gather={op.strategy('gather')})",
            f"self.{op.name}({call_args(*op.inputs)})",
            "embedding",
        )


class Positions(OpEmitter):
    kind = "positions"
    helpers = ("positions",)

    def code(self, op, model):
        (table,) = op.params
        seq, hidden = table.shape
        return Snippet(f"Positions({seq}, {hidden})", f"self.{op.name}()", "positions")
