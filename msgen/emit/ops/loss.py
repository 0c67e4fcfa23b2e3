"""`cross_entropy`'s code (msgen/ops/loss.py)."""

from __future__ import annotations

from msgen.emit.ops.base import OpEmitter, Snippet


class CrossEntropy(OpEmitter):
    kind = "cross_entropy"
    helpers = ("cross_entropy",)

    def code(self, op, model):
        logits, tokens = op.inputs
        # The spec names the network input; the target of position i is labels[i].
        labels = "labels" if tokens == model.network.input else tokens
        return Snippet(
            f"CrossEntropy({op.strategy('logits')})",
            f"self.{op.name}({logits}, {labels})",
            "cross_entropy",
        )
