"""The moe op's costs (msgen/ops/moe.py): the tensors it saves for backward and the
work it does, per micro-batch, as the estimate and the time model read them."""

from __future__ import annotations

from msgen.ops import moe_routing as routing
from msgen.ops.base import Saved, Work, saved_operand, tensor_bytes
from msgen.ops.moe_geometry import MoeGeometry

FP32 = 4
INDEX = 4  # int32 expert indices


def saves(op, node, inputs, output, ctx):
    """What backward reads, per micro-batch: x (the router's and shared experts'
    input), the router's fp32 probabilities [tokens, experts] (softmax's or
    sigmoid's backward reads its output) and the top-k weights and int32 indices,
    the permuted token copies [rows, hidden] (the experts' matmul input), each
    gated half and the activation [rows, ffn], and the experts' outputs
    [rows, hidden] (the un-permute buffer: the weights' gradient reads it);
    rows are `MoeGeometry.rows` (the copies times the load imbalance dropless), where each tp
    rank takes its own share of them and the experts' ffn dim is whole. With a
    capacity, the dispatch tensor and the combine tensor (dispatch times the
    router weights) [rows, group tokens] in the compute dtype: the backward of the
    batched matmuls that gather and scatter the slots reads them. The shared
    experts save their gated halves and activation [tokens, shared_ffn]; with
    `shared_sigmoid`, the gate's sigmoid [tokens, 1] and the shared output [tokens,
    hidden] it scales."""
    (x,) = inputs
    name, item = node.name, ctx.dtype_bytes
    lead = x.split[:-1]
    g = MoeGeometry.of(node, x.shape, ctx)
    n, h, e, k, f, rows = g.tokens, g.hidden, g.experts, g.top_k, g.ffn, g.rows
    tok_split = (tuple(a for dim in lead for a in dim), ())
    ffn_axes, expert_axes = g.tp_axes, g.expert_ffn_axes
    row_split = tok_split
    if expert_axes != ffn_axes and "tp" not in tok_split[0]:
        row_split = (tok_split[0] + ffn_axes, ())  # the dropless region's tp shares
    experts, shared = op.matrices(node)
    saved = [
        saved_operand(node.inputs[0].name, x),
        Saved(f"{name}.probs", (n, e), tok_split, FP32, "internal"),
        Saved(f"{name}.topk_weights", (n, k), tok_split, FP32, "internal"),
        Saved(f"{name}.topk_indices", (n, k), tok_split, INDEX, "internal"),
        Saved(f"{name}.permuted", (rows, h), row_split, item, "internal"),
    ]
    ffn_split = (row_split[0], expert_axes)
    for m in experts[:-1]:
        saved.append(Saved(f"{name}.{m}", (rows, f), ffn_split, item, "internal"))
    if len(experts) == 3:
        saved.append(Saved(f"{name}.act", (rows, f), ffn_split, item, "internal"))
    saved.append(Saved(f"{name}.expert_out", (rows, h), row_split, item, "internal"))
    if not g.dropless:
        for m in ("dispatch", "combine"):
            shape = (rows, g.group_tokens)
            saved.append(Saved(f"{name}.{m}", shape, row_split, item, "internal"))
    s = op.arg(node, "shared_ffn")
    for m in shared[:-1]:
        saved.append(Saved(f"{name}.{m}", (n, s), (tok_split[0], ffn_axes), item, "internal"))
    if len(shared) == 3:
        saved.append(
            Saved(f"{name}.shared_act", (n, s), (tok_split[0], ffn_axes), item, "internal")
        )
    if op.arg(node, "shared_sigmoid"):
        # the product's backward reads both factors: the gate and the shared output
        saved.append(Saved(f"{name}.shared_score", (n, 1), tok_split, item, "internal"))
        saved.append(Saved(f"{name}.shared_out", (n, h), tok_split, item, "internal"))
    return saved


def work(op, node, inputs, output, ctx):
    """Model FLOPs: the router (2 * tokens * hidden * experts) and the active
    experts only, each matrix 2 * tokens * top_k * hidden * ffn, plus the shared
    experts over every token (and their sigmoid gate's 2 * tokens * hidden). The
    kernels compute the capacity-padded rows and the dispatch and combine matmuls
    (2 * slots * group tokens * hidden each, per group), or the busiest expert
    rank's rows (times the load imbalance) when dropless.
    Memory-bound: the router's softmax, the permute and un-permute copies, the
    activation and the weighted combine, over the routed copies dropless and the
    padded slots with a capacity."""
    (x,) = inputs
    g = MoeGeometry.of(node, x.shape, ctx)
    n, h, e, k, f = g.tokens, g.hidden, g.experts, g.top_k, g.ffn
    experts, shared = op.matrices(node)
    s = op.arg(node, "shared_ffn")
    router = 2 * n * h * e
    active = len(experts) * 2 * n * k * h * f
    shared_flops = len(shared) * 2 * n * h * s
    gated = op.arg(node, "shared_sigmoid")
    shared_flops += gated * 2 * n * h  # the gate's [hidden, 1] matmul
    kernel = router + int(len(experts) * 2 * g.loaded * h * f) + shared_flops
    if not g.dropless:
        # dispatch and combine: per group [slots, group tokens] x [group tokens, h]
        kernel += 2 * 2 * g.rows * g.group_tokens * h
    item = ctx.dtype_bytes
    copies = g.copies  # the routed copies, or the padded slots
    memory = (
        tensor_bytes(inputs[0])
        + tensor_bytes(output)
        + 2 * n * e * FP32  # router probabilities written, read by top-k
        + 4 * copies * h * item  # permute and un-permute: each reads and writes them
        + 3 * copies * f * item  # the activation: two halves read, one written
        + 2 * n * s * item * (len(shared) > 0)
        + gated * 2 * n * (h + 1) * item  # sigmoid(gate) * shared output, read, written
        + routing.selection_bytes(node, n)
    )
    return Work(matmul_flops=router + active + shared_flops, kernel_flops=kernel,
                memory_bytes=memory)  # fmt: skip
