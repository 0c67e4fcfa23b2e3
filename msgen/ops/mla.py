"""`mla(x, heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, ...)`:
multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1; DeepSeek-V3,
arXiv 2412.19437, section 2.1.1), as transformers 4.57 computes it
(models/deepseek_v3/modeling_deepseek_v3.py `DeepseekV3Attention`,
models/deepseek_v2/modeling_deepseek_v2.py `DeepseekV2Attention`).

x [batch, seq, hidden] -> [batch, seq, heads * v_head_dim], always causal; the output
projection is the spec's own row-parallel `linear`, as it is for `attention`.
Per token, with d = qk_nope_head_dim + qk_rope_head_dim:

    c_q  = rmsnorm(x W_q_a) (q LoRA) ; q = c_q W_q_b, else q = x W_q: [heads, d] per head
    [c_kv | k_pe] = x W_kv_a          ; c_kv [kv_lora_rank], k_pe [qk_rope_head_dim]
    [k_nope | v] = rmsnorm(c_kv) W_kv_b: [heads, qk_nope_head_dim + v_head_dim]
    q = [q_nope | rope(q_pe)], k = [k_nope | rope(k_pe)] (one rope key for all heads)
    out = softmax(q k^T * scale + causal mask) v,  scale = d^-0.5 * mscale^2,
    mscale = 0.1 * mscale_all_dim * ln(factor) + 1 with `rope_scaling`'s factor and
    mscale_all_dim when it has one (DeepSeek's `yarn_get_mscale`), else 1.

`rope_scaling = yarn(...)` (or linear, llama3) scales the rope part's frequencies and
its cos and sin as transformers does (msgen.ops.rope_scaling, as `attention`);
`yarn_mscale = false` leaves the softmax scale alone, as transformers 4.57's
DeepseekV2Attention does.

Parameters are laid [in, out] as `linear`'s weight is: q_a, q_norm, q_b (q LoRA) or
q; kv_a (the fused down-projection and shared rope key, `kv_a_proj_with_mqa`), kv_norm,
kv_b; the up-projections' columns are per head, so a tp split of their last dim gives
whole heads. Over tp the down-projections, their norms and the latents are whole on
every rank and the up-projections column parallel (Megatron-Core's
multi_latent_attention.py: `linear_q_down_proj` / `linear_kv_down_proj` duplicated,
`linear_q_up_proj` / `linear_kv_up_proj` column parallel); the o projection after it is
row parallel.
"""

from __future__ import annotations

from math import prod

from msgen.ops.attention import rope_scaling
from msgen.ops.base import (
    Arg,
    Collective,
    Layout,
    OpDef,
    OpError,
    Param,
    Saved,
    Work,
    declared,
    factors,
    out_declared,
    saved_operand,
    tensor_bytes,
    whole,
)
from msgen.ops.linear import without
from msgen.ops.mla_geometry import MlaGeometry
from msgen.ops.rope_scaling import ScalingError, resolved

FP32 = 4
# FlashAttentionScore's head size D: a multiple of 16, at most 512 (its 2.10 docstring,
# ops/auto_generate/gen_ops_prim.py); q, k and v share it, so v is padded to q's.
FLASH_ALIGN, FLASH_MAX = 16, 512


def softmax_scale(node) -> float:
    """d^-0.5, times mscale^2 when the rope scaling names an mscale_all_dim and
    `yarn_mscale` holds (DeepseekV3Attention: `yarn_get_mscale(factor, mscale_all_dim)`,
    YaRN's attention temperature, whose one definition is rope_scaling.frequencies')."""
    scale = MlaGeometry.of(node).qk ** -0.5
    scaling = dict(rope_scaling(node) or ())
    if node.args.get("yarn_mscale", True) and scaling.get("mscale_all_dim"):
        from msgen.ops.rope_scaling.frequencies import _yarn_factor  # numpy: emission only

        mscale = _yarn_factor(scaling["factor"], scaling["mscale_all_dim"])
        scale *= mscale * mscale
    return scale


class Mla(OpDef):
    name = "mla"
    args = (
        Arg("x", "tensor"),
        Arg("heads", "int"),
        Arg("kv_lora_rank", "int"),
        Arg("qk_nope_head_dim", "int"),
        Arg("qk_rope_head_dim", "int"),
        Arg("v_head_dim", "int"),
        Arg("q_lora_rank", "int", None),
        Arg("rope_theta", "float", 10000.0, within="(0, inf)"),
        Arg("rope_interleave", "bool", True),
        Arg("rope_scaling", "call", None),
        Arg("yarn_mscale", "bool", True),
        Arg("eps", "float", 1e-6, within="(0, inf)"),
        Arg("flash", "bool", False),
    )
    params = ("q", "q_a", "q_norm", "q_b", "kv_a", "kv_norm", "kv_b")
    composite = True
    imports = (
        "from functools import cache",
        "import numpy as np",
        "from mindspore import Tensor, nn, ops",
        "from mindspore.common import dtype as mstype",
    )
    setting_imports = {
        "rope_scaling": ("import math",),  # the frequencies' source (rope_scaling.frequencies)
        "flash": (
            "import mindspore as ms",
            "from mindspore.ops.operations.nn_ops import FlashAttentionScore",
        ),
    }
    inits = {p: "ones" if p.endswith("norm") else "normal" for p in params}
    decays = frozenset(p for p in params if not p.endswith("norm"))

    # shape and parameters -----------------------------------------------------

    def shape(self, node, inputs, ctx):
        (x,) = inputs
        if len(x) != 3:
            raise OpError("MSL116", f"mla needs [batch, seq, hidden], got {list(x)}", "x")
        g = MlaGeometry.of(node)
        for arg in ("heads", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim", "q_lora_rank"):
            if node.args.get(arg) is not None and node.args[arg] < 1:
                raise OpError("MSL119", f"{arg} must be positive", arg)
        if g.rope < 2 or g.rope % 2:
            raise OpError(
                "MSL119",
                f"qk_rope_head_dim = {g.rope} must be even and positive",
                "qk_rope_head_dim",
                "rope rotates pairs of channels: DeepSeek-V2 and V3 use 64",
            )
        if node.args.get("rope_scaling") is not None:
            form = node.args["rope_scaling"]
            try:
                resolved(form.name, form.args)
            except ScalingError as e:
                raise OpError(e.code, e.message, "rope_scaling", e.hint) from None
        if g.flash and (g.qk % FLASH_ALIGN or g.qk > FLASH_MAX):
            raise OpError(
                "MSL119",
                f"flash needs qk_nope_head_dim + qk_rope_head_dim = {g.qk} a multiple "
                f"of {FLASH_ALIGN} and at most {FLASH_MAX} (FlashAttentionScore's head size)",
                "flash",
                "drop `flash = true` (the composed path has no such limit)",
            )
        if g.v > g.qk and g.flash:
            raise OpError(
                "MSL119",
                f"flash needs v_head_dim = {g.v} at most the q/k head size {g.qk}: v is "
                "padded to it",
                "flash",
                "drop `flash = true`",
            )
        return x[:-1] + (g.out_width,)

    def param_shapes(self, node, inputs, ctx):
        h = inputs[0][-1]
        g = MlaGeometry.of(node)
        shapes = (
            {"q_a": (h, g.q), "q_norm": (g.q,), "q_b": (g.q, g.q_width)}
            if g.q
            else {"q": (h, g.q_width)}
        )
        shapes |= {
            "kv_a": (h, g.kv_a_width),
            "kv_norm": (g.kv,),
            "kv_b": (g.kv, g.kv_b_width),
        }
        return shapes

    def layout(self, node, inputs, out_shape, ctx):
        """The heads over the output's last-dim axes (tp): x whole over them (the
        down-projections run on every rank), the up-projections column parallel, no
        collective forward; not written, the heads go over tp. Batch keeps its axes; the
        sequence and hidden dims are whole (a split there is gathered in front)."""
        (x,) = inputs
        # not written: the heads over tp, as Megatron-Core splits them
        tp = ("tp",) if ctx.mesh_sizes.get("tp", 1) > 1 else ()
        sb, _, sh = out_declared(node, 3) or (x.split[0], (), tp)
        sb = without((sb,), sh)[0]
        shapes = self.param_shapes(node, [x.shape], ctx)
        for name in node.param_shardings:
            if name not in shapes:
                lora = "with" if MlaGeometry.of(node).q else "without"
                raise OpError(
                    "MSL209",
                    f"mla `{node.name}` {lora} q_lora_rank has no parameter `{name}`",
                    name,
                    f"its parameters: {', '.join(shapes)}",
                )
        params = []
        for name, shape in shapes.items():
            split = ((), sh) if name in ("q", "q_b", "kv_b") else whole(len(shape))
            if name in node.param_shardings and declared(node, name, len(shape)) != split:
                raise OpError(
                    "MSL210",
                    f"`{name}` of mla `{node.name}` is laid out by the op: the down-projections "
                    "and norms whole, the up-projections split like the heads",
                    name,
                    f"drop `{name} @ [...]`; split the heads with `@ [dp, 1, tp]` on the op",
                )
            params.append(Param(name, shape, split))
        need = (sb, (), ())
        return Layout(inputs=(need,), output=(sb, (), sh), params=tuple(params))

    def divisible(self, node, layout, ctx):
        return [("heads", node.args["heads"], layout.output[-1])]

    def backward_collectives(self, node, inputs, layout, ctx):
        """The up-projections are column parallel: the gradients of their inputs (the
        q latent, or x without q LoRA, and the kv latent) are partial sums over the
        heads' axes, as is the shared rope key's (each rank sums over its own heads);
        all-reduced, as Megatron's ColumnParallelLinear does in backward."""
        sh = layout.output[-1]
        if not sh:
            return ()
        (x,) = inputs
        g = MlaGeometry.of(node)
        tokens = prod(x.shape[:-1])
        q_in = g.q or x.shape[-1]
        return (
            Collective("AllReduce", sh, tokens * q_in, "q latent gradient"),
            Collective("AllReduce", sh, tokens * g.kv_a_width, "kv latent gradient"),
        )

    # memory and work ----------------------------------------------------------

    def saves(self, node, inputs, output, ctx):
        """What the generated cell's backward reads, per micro-batch: x (both
        down-projections' weight gradients), with q LoRA its latent and the normed
        latent [tokens, q_lora_rank] (the norm's and q_b's backward), the kv latent and
        its normed copy [tokens, kv_lora_rank] (kv_norm's and kv_b's backward), all
        whole over the heads' axes; q and k per head after rope, [batch, heads, seq,
        qk head size] (the shared rope key copied to every head) and v [batch, heads,
        seq, v_head_dim] (QK^T's and PV's backward); the softmax probabilities
        [batch, heads, seq, seq], or with flash the kernel's output and its fp32
        softmax max and sum [batch, heads, seq, 8], v and the output padded to the
        q/k head size (the kernel's D)."""
        (x,) = inputs
        b, s, _ = x.shape
        g, item, name = MlaGeometry.of(node, ctx, output.split), ctx.dtype_bytes, node.name
        rows = (g.split.batch_axes, ())  # [batch, seq, latent]: whole over the heads' axes
        saved = [saved_operand(node.inputs[0].name, x)]
        latents = (("q_latent", "q_normed"), g.q), (("kv_latent", "kv_normed"), g.kv)
        for whats, n in latents:
            if n:
                for what in whats:
                    saved.append(Saved(f"{name}.{what}", (b, s, n), rows + ((),), item, "internal"))
        heads = g.split.scores
        for what, width in (("q", g.qk), ("k", g.qk), ("v", g.v_core)):
            shape = (b, g.heads, s, width)
            saved.append(Saved(f"{name}.{what}", shape, heads, item, "internal"))
        if g.flash:
            stats = (b, g.heads, s, 8)
            padded = (b, g.heads, s, g.qk)
            saved += [
                Saved(f"{name}.padded_out", padded, heads, item, "internal"),
                Saved(f"{name}.softmax_max", stats, heads, FP32, "internal"),
                Saved(f"{name}.softmax_sum", stats, heads, FP32, "internal"),
            ]
        else:
            scores = (b, g.heads, s, s)
            saved.append(Saved(f"{name}.probs", scores, heads, item, "internal"))
        return saved

    def work(self, node, inputs, output, ctx):
        """Model FLOPs: the five projections (2 * tokens * in * out each) and the core,
        QK^T over the q/k head size and PV over v_head_dim, every pair counted
        (Korthikanti's convention). The flash kernel computes the causal half, PV
        over v padded to the q/k head size. Memory-bound: x read twice, the latents'
        norms (read, written), rope on q_pe and k_pe, q and k assembled (written),
        the output written; without flash the scores go through memory four times,
        as `attention`'s."""
        (x,) = inputs
        b, s, h = x.shape
        g, item = MlaGeometry.of(node), ctx.dtype_bytes
        tokens, heads = b * s, g.heads
        projections = sum(2 * tokens * prod(shape) for shape in self._matrices(node, h))
        pairs = b * heads * s * s
        core = 2 * pairs * g.qk + 2 * pairs * g.v
        latent = tokens * (g.q + g.kv) * item
        rope = tokens * (heads + 1) * g.rope * item
        qk = 2 * tokens * heads * g.qk * item
        io = 2 * tensor_bytes(x) + tensor_bytes(output) + 2 * latent + 2 * rope + qk
        if g.flash:
            kernel = projections + 2 * pairs * g.qk  # (QK^T + padded PV) / 2
            return Work(projections + core, kernel, io + b * heads * s * FP32)
        return Work(projections + core, projections + core, io + pairs * 4 * item)

    def backward_work(self, node, forward):
        """Twice the forward's matmuls; the flash kernel recomputes the scores, 5
        matmuls of the core for its 2 (FlashAttention-2), the projections twice."""
        kernel = 2 * forward.kernel_flops
        if node.args.get("flash"):
            kernel = forward.kernel_flops * 5 // 2
        return Work(2 * forward.matmul_flops, kernel, 2 * forward.memory_bytes)

    def _matrices(self, node, hidden: int) -> list[tuple[int, int]]:
        return [s for s in self.param_shapes(node, [(hidden,)], None).values() if len(s) == 2]

    # strategies ---------------------------------------------------------------

    def strategies(self, node, layout, ctx):
        """The projections' MatMuls over [tokens, in] (tokens split like batch), the
        up-projections' output dim over the heads' axes; `core`: the attention core's
        [batch, heads, seq, dim] split."""
        heads = MlaGeometry.of(node, ctx, layout.output).split
        roles = []
        for p in layout.params:
            if len(p.shape) == 2:
                w = factors(p.split, ctx)
                roles.append((p.name, ((heads.batch_ways, w[0]), w)))
        return tuple(roles) + (("core", (heads.strategy,)),)
