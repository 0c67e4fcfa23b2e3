"""`cross_entropy(logits, tokens)`: next-token loss, the mean over all positions."""

from __future__ import annotations

from math import prod

from msgen.ops.base import (
    Arg,
    Collective,
    Layout,
    OpDef,
    OpError,
    Saved,
    Work,
    factors,
    tensor_bytes,
)


class CrossEntropy(OpDef):
    name = "cross_entropy"
    args = (Arg("logits", "tensor"), Arg("tokens", "tensor"))
    output_itemsize = 4  # fp32 (templates/ops/cross_entropy.py.j2)
    imports = (
        "from mindspore import Tensor, nn, ops",
        "from mindspore.common import dtype as mstype",
    )

    def strategies(self, node, layout, ctx):
        sb, ss, sv = factors(layout.inputs[0], ctx)
        return (("logits", ((sb * ss, sv),)),)

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
        # Vocab-parallel: the row max, the sum of exponentials and the label's logit are
        # reduced across the vocab shards (the generated CrossEntropy cell).
        rows = prod(logits.shape[:-1])
        what = "row max, sum of exponentials and label logit"
        collectives = (Collective("AllReduce", sv, 3 * rows, what),) if sv else ()
        return Layout(inputs=(logits.split, logits.split[:-1]), output=(), collectives=collectives)

    def saves(self, node, inputs, output, ctx):
        """What autodiff of the generated loss keeps, each at the logits' split: Exp keeps
        its fp32 output, Select its bool label mask, Log its fp32 row sums (the max is
        under stop_gradient; Cast, Sub, the sums and the mean keep nothing)."""
        logits, _ = inputs
        rows, split = logits.shape[:-1], logits.split
        return [
            Saved(f"{node.name}.exp", logits.shape, split, 4, "internal"),
            Saved(f"{node.name}.mask", logits.shape, split, 1, "internal"),
            Saved(f"{node.name}.sum", rows, split[:-1], 4, "internal"),
        ]

    def work(self, node, inputs, output, ctx):
        # read the logits and the targets, write the fp32 softmax and read it back
        logits, tokens = inputs
        return Work(
            memory_bytes=tensor_bytes(logits) + tensor_bytes(tokens) + 8 * prod(logits.shape)
        )
