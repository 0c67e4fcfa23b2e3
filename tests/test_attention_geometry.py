"""The attention ops' numbers (msgen/ops/attention_geometry.py `AttentionGeometry`,
`HeadSplit`; msgen/ops/mla_geometry.py `MlaGeometry`) against values derived by hand
in each docstring and the published checkpoints' weight shapes, and the ops' strategies
and saves reading them."""

from __future__ import annotations

from msgen.diagnostics import Span
from msgen.ir.models import OpNode
from msgen.ops import OPS
from msgen.ops.attention_geometry import AttentionGeometry, HeadSplit
from msgen.ops.base import Context, Layout, Tensor
from msgen.ops.mla_geometry import MlaGeometry

SPAN = Span(file="g.msl", line=1, col=1, end_line=1, end_col=2)
# [batch, seq, heads * size]: batch over dp, the heads over tp, the sequence whole
SPLIT = (("dp",), (), ("tp",))


def op(kind: str, **args) -> OpNode:
    return OpNode(span=SPAN, name="att", kind=kind, args=args)


def mesh(dims=None, **sizes) -> Context:
    return Context(mesh_sizes=sizes, dims=dims or {}, dtype_bytes=2)


def test_grouped_query_attention_of_llama2_70b():
    """Llama-2-70B: hidden 8,192, 64 heads, 8 kv heads: head_dim 8,192 / 64 = 128, 64 / 8
    = 8 query heads per kv head, qkv (64 + 2 x 8) x 128 = 10,240 wide, the output 64 x
    128 = 8,192. On dp 2, tp 8: 64 / 8 = 8 heads and 8 / 8 = 1 kv head per rank, the
    BNSD strategy (2, 8, 1, 1)."""
    ctx = mesh({"hidden": 8192}, dp=2, tp=8)
    g = AttentionGeometry.of(op("attention", heads=64, kv_heads=8), ctx, SPLIT)
    assert (g.head_dim, g.group, g.qkv_width, g.out_width) == (128, 8, 10240, 8192)
    assert (g.heads_per_rank, g.kv_heads_per_rank) == (8, 1)
    assert g.split.strategy == (2, 8, 1, 1)
    assert g.split.scores == (("dp",), ("tp",), (), ())


def test_a_model_head_dim_and_no_kv_heads():
    """Qwen3-style `head_dim = 128` with hidden 2,048 and 32 heads: the model's 128, not
    2,048 / 32 = 64; no kv_heads: one per query head, a group of 1, qkv 3 x 32 x 128."""
    g = AttentionGeometry.of(op("attention", heads=32), mesh({"hidden": 2048, "head_dim": 128}))
    assert (g.head_dim, g.kv_heads, g.group, g.qkv_width) == (128, 32, 1, 12288)
    assert g.split == HeadSplit()  # no split given: whole on one device


def test_the_head_split_reads_the_last_dim_and_the_batch_split_the_first():
    """[batch, seq, width] split (dp, sp, tp) with dp 2, sp 4, tp 8: the heads lie over
    the last dim's tp (8 ways), batch over dp (2 ways); the sequence's split is not a
    head split (attention gathers it in front)."""
    h = HeadSplit.of((("dp",), ("sp",), ("tp",)), mesh(dp=2, sp=4, tp=8))
    assert (h.batch_axes, h.head_axes, h.batch_ways, h.head_ways) == (("dp",), ("tp",), 2, 8)


def test_the_attention_ops_strategies_saves_and_checks_split_the_heads_over_tp():
    """The op's scores strategy, its saved probabilities [batch, heads, seq, seq] and
    its divisibility checks read the geometry: with qkv split (dp 2, 1, tp 4), the
    strategy (2, 4, 1, 1) for q and k, the probabilities split (dp, tp, -, -), heads
    and kv heads each divided by tp."""
    node = op("attention", heads=8, kv_heads=4, causal=True, rope=True)
    ctx = mesh({"hidden": 64}, dp=2, tp=4)
    layout = Layout(inputs=(SPLIT,), output=SPLIT)
    assert dict(OPS["attention"].strategies(node, layout, ctx))["scores"] == ((2, 4, 1, 1),) * 2
    qkv, out = Tensor((4, 16, 128), SPLIT, 2), Tensor((4, 16, 64), SPLIT, 2)
    probs = next(s for s in OPS["attention"].saves(node, [qkv], out, ctx) if "probs" in s.key)
    assert (probs.shape, probs.split) == ((4, 8, 16, 16), (("dp",), ("tp",), (), ()))
    div = OPS["attention"].divisible(node, layout, ctx)
    assert div == [("heads", 8, ("tp",)), ("kv_heads", 4, ("tp",))]


def test_mla_of_deepseek_v3_has_its_published_weight_shapes():
    """DeepSeek-V3 (its config.json: 128 heads, q_lora_rank 1,536, kv_lora_rank 512,
    qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128): q/k heads 128 + 64 =
    192; q_b_proj's output 128 x 192 = 24,576, kv_a_proj_with_mqa's 512 + 64 = 576,
    kv_b_proj's 128 x (128 + 128) = 32,768, o_proj's input 128 x 128 = 16,384 (the
    checkpoint's [24576, 1536], [576, 7168], [32768, 512], [7168, 16384]). Flash pads v to
    192. On dp 4, tp 8: 128 / 8 = 16 heads per rank, the core's strategy (4, 8, 1, 1)."""
    node = op(
        "mla", heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, flash=True,
    )  # fmt: skip
    g = MlaGeometry.of(node, mesh(dp=4, tp=8), SPLIT)
    assert (g.qk, g.q_width, g.kv_a_width, g.kv_b_width, g.out_width) == (
        192, 24576, 576, 32768, 16384,
    )  # fmt: skip
    assert (g.q, g.v_core, g.heads_per_rank) == (1536, 192, 16)
    assert g.split.strategy == (4, 8, 1, 1)
    shapes = OPS["mla"].param_shapes(node, [(1, 1, 7168)], None)
    assert (shapes["q_b"], shapes["kv_a"], shapes["kv_b"]) == (
        (1536, 24576), (7168, 576), (512, 32768),
    )  # fmt: skip


def test_mla_without_q_lora_of_deepseek_v2_lite():
    """DeepSeek-V2-Lite: 16 heads, no q LoRA, kv_lora_rank 512, 128 + 64, v 128: q_proj's
    output 16 x 192 = 3,072, kv_b's 16 x 256 = 4,096; without flash v stays 128."""
    node = op(
        "mla", heads=16, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128,
    )  # fmt: skip
    g = MlaGeometry.of(node)
    assert (g.q, g.q_width, g.kv_b_width, g.v_core, g.out_width) == (0, 3072, 4096, 128, 2048)
