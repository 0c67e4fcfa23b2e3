"""`attention(qkv, heads, kv_heads, causal, rope, rope_theta, rope_scaling, window, flash,
dropout, qk_norm)` over a fused QKV.

qkv is [batch, seq, (heads + 2 * kv_heads) * head_dim], laid out per kv group
(its query heads, then its k, then its v), so a split of the last dim splits
whole groups. Output is [batch, seq, heads * head_dim]. `qk_norm` normalises each head of q and k
(RMSNorm over head_dim, eps 1e-6, before rope) with the parameters q_norm and k_norm
[head_dim], as Qwen3 (transformers' Qwen3Attention). `rope_scaling = llama3(...)`,
`yarn(...)` or `linear(...)` scales rope's frequencies (and with yarn its cos and sin)
as transformers does (msgen.ops.rope_scaling); it changes no shape, memory or FLOPs.
"""

from __future__ import annotations

from msgen.ops.attention_geometry import AttentionGeometry
from msgen.ops.base import (
    Arg,
    Layout,
    OpDef,
    OpError,
    Param,
    Saved,
    Work,
    out_declared,
    tensor_bytes,
)
from msgen.ops.linear import without
from msgen.ops.rope_scaling import ScalingError, resolved


def window_cells(seq: int, window: int) -> int:
    """Query-key pairs a sliding-window attention scores: each position sees itself
    and the `window - 1` before it."""
    w = min(window, seq)
    return w * seq - w * (w - 1) // 2


def check_scaling(node) -> None:
    """`rope_scaling` as msgen.ops.rope_scaling takes it, and only with rope."""
    form = node.args["rope_scaling"]
    if not node.args.get("rope"):
        raise OpError("MSL119", "rope_scaling scales rope: it needs rope = true", "rope_scaling")
    try:
        resolved(form.name, form.args)
    except ScalingError as e:
        raise OpError(e.code, e.message, "rope_scaling", e.hint) from None


def rope_scaling(node) -> tuple[tuple[str, object], ...] | None:
    """The scaling as the generated cell takes it, transformers' `rope_scaling` dict
    (its `rope_type`, then each parameter set or defaulted), as items."""
    form = node.args.get("rope_scaling")
    if form is None:
        return None
    params = resolved(form.name, form.args)
    return (("rope_type", form.name),) + tuple((k, v) for k, v in params.items() if v is not None)


class Attention(OpDef):
    name = "attention"
    args = (
        Arg("qkv", "tensor"),
        Arg("heads", "int"),
        Arg("kv_heads", "int", None),
        Arg("causal", "bool", False),
        Arg("rope", "bool", False),
        Arg("rope_theta", "float", 10000.0, within="(0, inf)"),
        Arg("rope_scaling", "call", None),
        Arg("window", "int", None),
        Arg("flash", "bool", False),
        Arg("dropout", "float", 0.0, within="[0, 1)"),
        Arg("qk_norm", "bool", False),
    )
    composite = True
    inits = {"q_norm": "ones", "k_norm": "ones"}
    imports = (
        "from functools import cache",
        "import numpy as np",
        "from mindspore import Tensor, nn, ops",
        "from mindspore.common import dtype as mstype",
    )
    # with flash, FlashAttentionScore, picked on Ascend only (model.py's fused_kernels)
    setting_imports = {
        "flash": ("from mindspore.ops.operations.nn_ops import FlashAttentionScore",),
        "rope": ("from mindspore.ops.auto_generate import RotaryPositionEmbedding",),
        # the scaled frequencies' source (msgen/ops/rope_scaling/frequencies.py) reads math
        "rope_scaling": ("import math",),
    }

    # with rope, RotaryPositionEmbedding on Ascend; with flash, FlashAttentionScore
    fused_roles = {"rope_kernel": "RotaryPositionEmbedding", "flash": "FlashAttentionScore"}

    def strategies(self, node, layout, ctx):
        q = AttentionGeometry.of(node, ctx, layout.inputs[0]).split.strategy
        roles = [("scores", (q, q))]
        if self.arg(node, "rope"):
            # x split as the scores are (batch, heads), head_dim whole for the rotation's
            # halves; the cos and sin tables whole, as mindformers shards the kernel
            # (training_graph/base_models/common/embeddings/rope_utils.py)
            roles.append(("rope_kernel", (q, (1, 1, 1, 1), (1, 1, 1, 1))))
        if self.arg(node, "flash"):
            # q, k, v split as the scores are, BNSD; a causal model's compressed mask whole
            mask = ((1, 1),) if self.arg(node, "causal") else ()
            roles.append(("flash", (q, q, q) + mask))
        return tuple(roles)

    def shape(self, node, inputs, ctx):
        (qkv,) = inputs
        g = AttentionGeometry.of(node, ctx)
        heads, groups = g.heads, g.kv_heads
        if len(qkv) != 3:
            raise OpError("MSL116", f"attention needs [batch, seq, width], got {list(qkv)}", "qkv")
        if heads % groups:
            raise OpError(
                "MSL119", f"heads = {heads} is not a multiple of kv_heads = {groups}", "kv_heads"
            )
        window = node.args.get("window")
        if window is not None and not (node.args.get("causal") and 0 < window):
            raise OpError(
                "MSL119",
                f"window = {window} needs causal = true and a positive size",
                "window",
                "a sliding window lets each position see itself and the window - 1 before it",
            )
        hd = g.head_dim
        if hd <= 0:
            raise OpError("MSL119", "head_dim must be positive", "heads")
        if node.args.get("rope_scaling") is not None:
            check_scaling(node)
        want = g.qkv_width
        if qkv[-1] != want:
            raise OpError(
                "MSL119",
                f"qkv width is {qkv[-1]}, but (heads + 2 * kv_heads) * head_dim = "
                f"({heads} + 2 * {groups}) * {hd} = {want}",
                "qkv",
                "project to (heads + 2 * kv_heads) * head_dim, or define `head_dim` in the model",
            )
        return qkv[:-1] + (g.out_width,)

    def param_shapes(self, node, inputs, ctx):
        hd = AttentionGeometry.of(node, ctx).head_dim
        return {"q_norm": (hd,), "k_norm": (hd,)} if node.args.get("qk_norm") else {}

    def layout(self, node, inputs, out_shape, ctx):
        (qkv,) = inputs
        decl = out_declared(node, 3)
        sb, _, sh = decl or qkv.split
        sb = without((sb,), sh)[0]
        # attention needs whole sequences: a seq split is gathered in front
        need = (sb, (), sh)
        params = tuple(
            Param(name, shape, ((),)) for name, shape in self.param_shapes(node, [], ctx).items()
        )
        return Layout(inputs=(need,), output=need, params=params)

    def divisible(self, node, layout, ctx):
        g = AttentionGeometry.of(node, ctx, layout.output)
        sh = g.split.head_axes
        return [("heads", g.heads, sh), ("kv_heads", g.kv_heads, sh)]

    def saves(self, node, inputs, output, ctx):
        (qkv,) = inputs
        b, s, _ = qkv.shape
        g = AttentionGeometry.of(node, ctx, output.split)
        heads = g.heads
        item = ctx.dtype_bytes
        # backward needs the rotated q and k (and v), a tensor of qkv's size, or the
        # normed ones without rope; the q/k norms' backward reads their input, qkv.
        # The fused rope saves nothing more: RotaryPositionEmbeddingGrad reads dy, cos
        # and sin (ops/auto_generate/gen_ops_prim.py).
        rope, qk_norm = node.args.get("rope"), node.args.get("qk_norm")
        own = "qkv_rope" if rope else ("qk_normed" if qk_norm else None)
        saved = [Saved(f"{node.name}.{own}", qkv.shape, qkv.split, item, "internal")] if own else []
        if qk_norm or not rope:
            saved.insert(0, Saved(node.inputs[0].name, qkv.shape, qkv.split, item, "input"))
        heads_split = g.split.scores
        if node.args.get("flash"):
            # FlashAttentionScore's backward reads its output and its fp32 softmax_max and
            # softmax_sum, each [batch, heads, seq, 8] (its 2.10 docstring), and with
            # dropout the packed keep bits, [batch, heads, seq, seq / 8] uint8.
            stats = (b, heads, s, 8)
            saved += [
                Saved(node.name, output.shape, output.split, item, "output"),
                Saved(f"{node.name}.softmax_max", stats, heads_split, 4, "internal"),
                Saved(f"{node.name}.softmax_sum", stats, heads_split, 4, "internal"),
            ]
            if node.args.get("dropout"):
                bits = (b, heads, s, s // 8)
                saved.append(Saved(f"{node.name}.keep_bits", bits, heads_split, 1, "internal"))
            return saved
        scores = (b, heads, s, s)
        saved.append(Saved(f"{node.name}.probs", scores, heads_split, item, "internal"))
        if node.args.get("dropout"):
            saved.append(Saved(f"{node.name}.mask", scores, heads_split, 1, "internal"))
            saved.append(Saved(f"{node.name}.dropped", scores, heads_split, item, "internal"))
        return saved

    def work(self, node, inputs, output, ctx):
        """QK^T and PV, 2 * b * heads * s^2 * head_dim FLOPs each. Model FLOPs count
        the causal half too (Korthikanti); the flash kernel skips the masked blocks.
        Without flash the scores go through memory: QK^T writes them, softmax reads
        and writes them, PV reads them (and dropout reads them, writes its output
        and its 1-byte mask)."""
        (qkv,) = inputs
        b, s, _ = qkv.shape
        g = AttentionGeometry.of(node, ctx)
        scores = b * g.heads * s * s
        flops = 2 * scores * g.head_dim * 2
        io = tensor_bytes(qkv) + tensor_bytes(output)
        if node.args.get("rope"):
            io += 2 * tensor_bytes(qkv)  # q and k rotated: read and written
        if node.args.get("qk_norm"):
            io += 2 * tensor_bytes(qkv)  # q and k normalised: read and written
        item = ctx.dtype_bytes
        if node.args.get("flash"):
            kernel = flops
            if node.args.get("window"):  # the band: each row scores `window` keys at most
                kernel = flops * window_cells(s, node.args["window"]) // (s * s)
            elif node.args.get("causal"):
                kernel = flops // 2
            return Work(flops, kernel, io + b * g.heads * s * 4)  # + fp32 lse
        through_memory = scores * 4 * item
        if node.args.get("dropout"):
            through_memory += scores * (2 * item + 1)
        return Work(flops, flops, io + through_memory)

    def backward_work(self, node, forward):
        """Twice the forward's matmuls (model FLOPs); the flash kernel recomputes
        the scores as well, 5 matmuls for the forward's 2 (FlashAttention-2). The
        scores' memory traffic without flash: dropout, softmax and the two
        matmuls' gradients go through them twice as often as forward."""
        kernel = (
            forward.kernel_flops * 5 // 2 if node.args.get("flash") else 2 * forward.kernel_flops
        )
        return Work(2 * forward.matmul_flops, kernel, 2 * forward.memory_bytes)
