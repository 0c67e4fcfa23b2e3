"""`cross_entropy(logits, tokens)`: next-token loss, the mean over all positions."""

from __future__ import annotations

from math import prod

from msgen.ops.base import Arg, Collective, Layout, OpDef, OpError, Saved, Work, tensor_bytes


class CrossEntropy(OpDef):
    name = "cross_entropy"
    args = (Arg("logits", "tensor"), Arg("tokens", "tensor"))

    def shape(self, node, inputs, ctx):
        logits, tokens = inputs
        if len(logits) != len(tokens) + 1 or logits[:-1] != tokens:
            raise OpError(
                "MSL117",
                f"cross_entropy needs logits [..., vocab] over the tokens' shape; got "
                f"{list(logits)} and {list(tokens)}",
                None,
            )
        return ()

    def layout(self, node, inputs, out_shape, ctx):
        logits, _ = inputs
        sv = logits.split[-1]
        # a vocab split needs the row max and sum across the shards
        rows = prod(logits.shape[:-1])
        collectives = (Collective("AllReduce", sv, 2 * rows, "softmax max and sum"),) if sv else ()
        return Layout(inputs=(logits.split, logits.split[:-1]), output=(), collectives=collectives)

    def saves(self, node, inputs, output, ctx):
        logits, _ = inputs
        return [Saved(f"{node.name}.logits", logits.shape, logits.split, 4, "internal")]

    def work(self, node, inputs, output, ctx):
        # read the logits and the targets, write the fp32 softmax and read it back
        logits, tokens = inputs
        return Work(
            memory_bytes=tensor_bytes(logits) + tensor_bytes(tokens) + 8 * prod(logits.shape)
        )
