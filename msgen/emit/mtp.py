"""Multi-token prediction in model.py: the modules' record (`MtpSpec`, from the plan's
msgen.analysis.mtp.Module) and the network's lines that run them after its loss.

The modules are one `MultiTokenPrediction` cell, `self.mtp` (parameters
`mtp.layers.<k>.<part>.<param>`, Megatron-LM's names), on the last pipeline stage;
that name and the construct's locals are reserved (msgen/checks/reserved.py). The
network calls its own output layer on each module's normed output (the same cell, the
same weight), and passes the embedding table in, as the tied output layer takes it.
"""

from __future__ import annotations

import dataclasses

from msgen.analysis.plan import Plan
from msgen.emit.context import ModelContext, MtpSpec, OpSpec
from msgen.emit.ops import EMITTERS
from msgen.ops.base import Context

# what templates/ops/mtp.py.j2 imports
IMPORTS = (
    "import numpy as np",
    "from mindspore import Parameter, Tensor, nn, ops",
    "from mindspore.common import dtype as mstype",
)


def helpers(ctx: ModelContext) -> frozenset[str]:
    """The helper cells the modules build: theirs, the norm's, eh_proj's."""
    m = ctx.mtp
    assert m is not None
    norm = next(op for op in ctx.network.ops if op.name == m.hidden)
    return frozenset({"mtp", "linear", *EMITTERS[norm.kind].helpers})


def mtp_spec(plan: Plan, net_ops: list[OpSpec], ctx: Context, op_spec) -> MtpSpec | None:
    """The record model.py's modules are written from; `op_spec` is emit.build's."""
    mod = plan.mtp
    if mod is None:
        return None
    ops = {op.name: op for op in net_ops}
    norm, emb, loss = ops[mod.shared.norm], ops[mod.shared.embedding], ops[mod.shared.loss]
    eh_proj = op_spec(mod.eh_proj, ctx)
    (x,) = norm.strategy("norm")[:1]
    table, ids = emb.strategy("gather")
    (logits,) = loss.strategy("logits")
    return MtpSpec(
        depth=mod.setting.depth,
        weight=mod.setting.weight,
        layer=mod.setting.layer,
        hidden=mod.shared.norm,
        embedding=emb.name,
        head=mod.shared.head,
        loss=loss.name,
        eh_proj=eh_proj,
        concat=(x, x),
        ids=ids,
        gather=(table, ids),
        rows=(logits[0], 1),
        stage=loss.stage,
        segment=loss.segment,
    )


def init_lines(ctx: ModelContext) -> list[str]:
    """The network's `__init__` lines for the modules."""
    m = ctx.mtp
    assert m is not None
    layer = ctx.layer(m.layer)
    net = {op.name: op for op in ctx.network.ops}
    norm = EMITTERS[net[m.hidden].kind].code(net[m.hidden], ctx).make
    eh_proj = EMITTERS[m.eh_proj.kind].code(m.eh_proj, ctx).make
    cross_entropy = EMITTERS[net[m.loss].kind].code(net[m.loss], ctx).make
    lines = [
        "self.mtp = MultiTokenPrediction(",
        "    [",
        "        MtpLayer(",
        f"            {norm},",
        f"            {norm},",
        f"            {eh_proj},",
        f"            {layer.class_name}(),",
        f"            {norm},",
        f"            concat={m.concat},",
        "        )",
        f"        for _ in range({m.depth})",
        "    ],",
        f"    weight={m.weight!r},",
        f"    seq={ctx.seq},",
        f"    ids={m.ids},",
        f"    gather={m.gather},",
        f"    cross_entropy={cross_entropy},",
        f"    rows={m.rows},",
        ")",
    ]
    if layer.recompute:  # the block is a copy of the layer: recomputed as its copies are
        lines += ["for module in self.mtp.layers:", "    module.block.recompute()"]
    if ctx.pp > 1:
        lines.append(f"self.mtp.pipeline_stage = {m.stage}")
        if ctx.chunks > 1:
            lines.append(f"self.mtp.pipeline_segment = {m.segment}")
    return lines


def construct_lines(ctx: ModelContext, aux: bool) -> list[str]:
    """After the loss: each module's loss, then the loss with their weighted mean."""
    m = ctx.mtp
    assert m is not None
    head = next(op for op in ctx.network.ops if op.name == m.head)
    call = EMITTERS[head.kind].code(dataclasses.replace(head, inputs=("mtp_normed",)), ctx).call
    module = "self.mtp.layers[depth](mtp_hidden, mtp_embedded" + (", aux)" if aux else ")")
    outputs = "mtp_hidden, mtp_normed" + (", aux" if aux else "")
    return [
        f"mtp_ids, mtp_labels, mtp_hidden = {ctx.network.input}, labels, {m.hidden}",
        "mtp_losses = ()",
        f"for depth in range({m.depth}):",
        "    mtp_ids = self.mtp.shift(mtp_ids)",
        "    mtp_labels = self.mtp.shift(mtp_labels)",
        f"    mtp_embedded = self.mtp.embed(mtp_ids, self.{m.embedding}.table)",
        f"    {outputs} = {module}",
        f"    mtp_losses += (self.mtp.loss({call}, mtp_labels, depth),)",
        f"{m.loss} = self.mtp({m.loss}, mtp_losses)",
    ]
