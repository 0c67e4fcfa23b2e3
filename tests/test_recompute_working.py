"""The recomputed layer's working memory (`recompute_working_bytes`) against hand
derivations: one MoE layer (specs/validation/mixtral_8x7b.msl, at imbalance 1 and 4 and
with a capacity), one dense layer (Korthikanti et al. 2022's 22B GPT, full recompute),
and selective recompute, where the working set is the largest backward step, not the
sum of what was dropped.

What coexists at the peak. A layer's backward runs its ops' backward in reverse order.
Under full recompute the last op that saved anything needs its tensors first; making
them again reruns the chain from the kept layer input, so at that moment every tensor
the layer saves without recompute exists again beside the kept inputs of every layer and
micro-batch in flight (the activations row), and nothing of the layer is freed yet: one
layer's saved set less its input, for one micro-batch, once per stage (one layer is
recomputed at a time). On the stage holding the loss, what the ops after the layers
saved for that micro-batch (the final norm's and output layer's inputs, the loss's fp32
logits) is freed before any layer's backward begins, so the row there is net of it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_estimate import KORTHIKANTI, checked, estimate_file, estimate_of, spec_text

from msgen.analysis.plan import Plan
from msgen.compiler import analyze, analyze_text
from msgen.estimate.activations import recompute_working_bytes
from msgen.estimate.memory import estimate
from msgen.estimate.report import ROWS

VALIDATION = Path(__file__).resolve().parents[1] / "specs" / "validation"
MIXTRAL = VALIDATION / "mixtral_8x7b.msl"
QWEN3 = VALIDATION / "qwen3_30b_a3b.msl"
MiB = 2**20

# Mixtral-8x7B as specs/validation/mixtral_8x7b.msl lays it, per device and micro-batch:
# micro_batch 1 x dp 8 sequences of 4096 tokens = 32,768 tokens, 4,096 a device (dp 8,
# tp 1); hidden 4096, bf16 (2 bytes); one [4096, 4096] tensor is 32 MiB.
# Re-made outside the experts (the layer's input x, 32 MiB, is kept):
MIXTRAL_ATTENTION = (
    32  # n1: the qkv linear's input
    + 48  # att.qkv_rope: q, k, v after rope, [4096, (32 + 2 x 8) x 128 = 6144]
    + 32  # att: the flash attention's output, the o linear's input
    + 2 * 4  # the fp32 softmax max and sum, [32 heads, 4096, 8] each (4 MiB)
    + 32  # h: n2's input
    + 32  # n2: the moe's input
)  # 184 MiB
# The router's fp32 probabilities [4096, 8] (128 KiB), the fp32 top-k weights and int32
# indices [4096, 2] (32 KiB each):
MIXTRAL_ROUTER = 0.1875


def mixtral_experts(rows: int, dispatch_combine: float = 0) -> float:
    """MiB of the experts' tensors over `rows` token copies a device: the permuted
    copies and the experts' outputs [rows, 4096], swiglu's gate, up and product
    [rows, 14336], all bf16; with a capacity, the dispatch and combine tensors."""
    return (2 * rows * 4096 + 3 * rows * 14336) * 2 / MiB + dispatch_combine


def analysed(path: Path, old: str = "", new: str = ""):
    text = path.read_text().replace(old, new)
    result = analyze_text(text, path.name, path.parent)
    assert result.ok, [d.message for d in result.diagnostics if d.is_error]
    return estimate(Plan(result.spec, result.facts))


def mixtral(moe_args: str = ""):
    return analysed(MIXTRAL, "aux_loss = 0.02)", f"aux_loss = 0.02{moe_args})")


def test_mixtral_recomputed_layer_by_hand():
    """Dropless, the 32,768 tokens' top_k 2 copies are 65,536 rows, an ep group's over
    its dp ranks: 8,192 a device (each expert whole over tp 1). The experts: 64 + 3 x 224
    + 64 = 800 MiB; with the router's 0.1875 and the attention half's 184: 984.1875 MiB
    (the issue's "about 1.0 GiB"), on each of the first three stages."""
    est = mixtral()
    want = (MIXTRAL_ATTENTION + MIXTRAL_ROUTER + mixtral_experts(8192)) * MiB
    assert want == 984.1875 * MiB
    assert [s.recompute_working_bytes for s in est.stages[:3]] == [want] * 3
    (kind,) = est.stages[0].layer_kinds
    assert kind.recompute_working_bytes == want


def test_mixtral_loss_stage_is_net_of_what_the_loss_freed():
    """Stage 3 holds the final norm (its input, 32 MiB), the output layer (its input,
    32 MiB) and the loss: fp32 exp [4096, 32000] = 500 MiB, its 1-byte mask 125 MiB and
    the fp32 row sums 16 KiB. All are freed once the loss's and output layer's backward
    ran, before the last layer's: 984.1875 - 689.015625 = 295.171875 MiB."""
    last = mixtral().stages[3]
    assert last.freed_before_layers_bytes == (32 + 32 + 500 + 125) * MiB + 16 * 1024
    assert last.recompute_working_bytes == 295.171875 * MiB


def test_mixtral_peak_rises_with_imbalance_4_by_the_hand_derived_amount():
    """imbalance = 4: the busiest rank's copies are ceil(65,536 x 4) = 262,144 rows,
    32,768 a device: the experts' tensors 4 x 800 = 3,200 MiB, the working memory
    3,384.1875 MiB (the issue's 3.3 GiB). Stage 0 stays the peak (it keeps 4
    micro-batches' inputs) and rises by 2,400 MiB; no other row moves."""
    one, four = mixtral(), mixtral(", imbalance = 4")
    want = (MIXTRAL_ATTENTION + MIXTRAL_ROUTER + mixtral_experts(32768)) * MiB
    assert want == 3384.1875 * MiB
    assert four.stages[0].recompute_working_bytes == want
    assert one.peak.stage == four.peak.stage == 0
    assert four.peak.total_bytes - one.peak.total_bytes == 2400 * MiB
    others = [key for key, _ in ROWS if key != "recompute_working_bytes"]
    assert [getattr(four.stages[0], k) for k in others] == [
        getattr(one.stages[0], k) for k in others
    ]


def test_mixtral_capacity_moves_it_by_hand():
    """capacity = 2.0: GShard's groups are the dp 8 ranks of 4,096 tokens; each expert
    gets min(4096, ceil(4096 x 2 / 8 x 2.0)) = 2,048 slots a group, 8 x 8 x 2,048 =
    131,072 rows, 16,384 a device: the experts' tensors 128 + 3 x 448 + 128 MiB, and the
    dispatch and combine tensors [16,384 rows, 4,096 group tokens] bf16, 128 MiB each."""
    est = mixtral(", capacity = 2.0")
    want = (MIXTRAL_ATTENTION + MIXTRAL_ROUTER + mixtral_experts(16384, 2 * 128)) * MiB
    assert want == 2040.1875 * MiB
    assert est.stages[0].recompute_working_bytes == want


def test_qwen3_imbalance_moves_stage_0_by_hand():
    """Qwen3-30B-A3B (dp 4, ep 4, tp 1): 16,384 tokens x top_k 8 = 131,072 copies,
    32,768 a device; each of permuted and the experts' outputs [32,768, 2048] bf16 is
    128 MiB, each of gate, up and product [32,768, 768] 48 MiB: 400 MiB; imbalance 4 adds
    3 x 400 = 1,200 MiB to stage 0. Its last stage stays the peak: the loss's fp32 logits
    (151,936 vocab) freed before the layers' backward outweigh the layer's working set."""
    one = analysed(QWEN3)
    four = analysed(QWEN3, "aux_loss = 0.001)", "aux_loss = 0.001, imbalance = 4)")
    assert four.stages[0].total_bytes - one.stages[0].total_bytes == 1200 * MiB
    assert one.stages[3].recompute_working_bytes == four.stages[3].recompute_working_bytes == 0


def test_dense_full_recompute_korthikanti_22b_by_hand():
    """The 22B GPT of reference/estimator.md (s 2048, b 4, h 6144, a 64, t 8, V 51200,
    p 1, fp16, dropout everywhere): without recompute a layer saves sbh(10 + 24/t +
    5as/(ht)) bytes (the published 59.25 GiB over 48 layers); full recompute keeps its
    input, 2sbh, and re-makes the rest: sbh(8 + 3 + 40/3) = 73sbh/3. Net of what the
    one stage's ops after the layers freed: the final layernorm's input and the output
    layer's input (2sbh each, whole over t), the loss's fp32 exp and 1-byte mask over
    the vocab split over t (5 s b V / t) and its fp32 row sums (4sb)."""
    s, b, h, a, t, v = 2048, 4, 6144, 64, 8, 51200
    sbh = s * b * h
    remade = sbh * (10 + 24 // t) + 5 * a * s * s * b // t - 2 * sbh
    assert remade == 73 * sbh // 3
    freed = 4 * sbh + 5 * s * b * v // t + 4 * s * b
    (stage,) = estimate_file(KORTHIKANTI, ["recompute.decoder=full"]).stages
    assert stage.activation_bytes_per_layer == 2 * sbh  # the published kept input
    assert stage.freed_before_layers_bytes == freed
    assert stage.recompute_working_bytes == remade - freed


SELECT_DIMS = "vocab = 512\n hidden = 64\n heads = 4\n ffn = 4 * hidden\n seq = 512"


def test_selective_attention_working_set_by_hand():
    """test_estimate's GPT layer (attention dropout) at s 512, h 64, a 4, b 1, t 2, pp 2,
    `select(att)`: the attention core's softmax, dropout mask and dropped probabilities,
    5as²b/t = 80 sbh, are re-made at the attention's backward; by then the later ops'
    kept tensors are freed: the proj input 2sbh/t, the two dropout masks sbh each, h and
    ln2 2sbh each, up and act 8sbh/t each: (6 + 18/t) sbh = 15 sbh. Stage 0: 65 sbh.
    Stage 1 (the loss's): less the final norm's and output layer's inputs (2sbh each),
    the loss's fp32 exp and mask over vocab 512 / t (5 s V / t) and row sums (4s)."""
    s, h, v, t = 512, 64, 512, 2
    sbh = s * h
    text = spec_text(tp=t, pp=2, micro_batches=2, recompute="select(att)", dims=SELECT_DIMS)
    result = checked(text)
    first, last = estimate(Plan(result.spec, result.facts)).stages
    assert first.recompute_working_bytes == 65 * sbh
    assert last.recompute_working_bytes == 65 * sbh - (4 * sbh + 5 * s * v // t + 4 * s)


def test_the_working_set_is_the_largest_step_not_the_sum():
    """specs/gpt7b.msl with `select(att, act)`, per device (dp 4, tp 2, s 2048, h 4096,
    b 1, bf16, no attention dropout): at down's backward gelu reruns, its output
    [2048, 16384 / 2] = 32 MiB, the second dropout's mask (8 MiB) already freed: +24 MiB;
    at the attention's backward its probabilities [32 / 2 heads, 2048, 2048] = 128 MiB
    are re-made, gelu's output gone and the later ops' kept tensors freed (proj input 8,
    d1 mask 8, h 16, ln2 16, up 32, d2 mask 8 MiB): 128 - 88 = +40 MiB. The layer's
    working set is 40 MiB, not 32 + 128."""
    result = analyze(Path(__file__).resolve().parents[1] / "specs" / "gpt7b.msl",
                     ["recompute.decoder=select(att, act)"])  # fmt: skip
    m = result.spec.mesh
    sizes = {"dp": m.dp, "tp": m.tp, "pp": m.pp, "ep": m.ep}
    rc = result.spec.recompute["decoder"]
    assert recompute_working_bytes(result.facts.graphs["decoder"], rc, sizes) == 40 * MiB


@pytest.mark.parametrize("recompute", ["none", "select(ln1)"])
def test_nothing_re_made_nothing_counted(recompute):
    """No recompute re-makes nothing; `select(ln1)` re-makes ln1's output (the qkv
    linear's input) at qkv's backward, when more than that is freed already."""
    est = estimate_of(spec_text(tp=2, recompute=recompute, dims=SELECT_DIMS))
    assert [s.recompute_working_bytes for s in est.stages] == [0]
