"""The mla op's estimate and checks: its parameters (transformers' own count of
DeepseekV3Attention with DeepSeek-V3's sizes), its activation memory per layer derived
by hand below, with and without flash and under `select(att)`, its model FLOPs by hand,
and the located diagnostics for heads a tp split would cut and what else it refuses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from msgen.analysis.plan import Plan
from msgen.compiler import analyze_text
from msgen.estimate.flops import step_flops
from msgen.estimate.memory import estimate
from tests.emit_fixtures import SPECS
from tests.oracles import require
from tests.test_estimate import checked, spec_text

# DeepSeek-V3's attention (its config.json): hidden h, heads a, q_lora_rank q_c,
# kv_lora_rank kv_c, qk_nope_head_dim n, qk_rope_head_dim r, v_head_dim d_v; over
# tp = 8, micro_batch b = 1, seq s = 4096, bf16.
h, a, q_c, kv_c, n, r, d_v = 7168, 128, 1536, 512, 128, 64, 128
d_qk = n + r
s, b, t, L, V = 4096, 1, 8, 2, 1024

MLA_LAYER = """
    input x : [batch, seq, hidden] @ [dp, 1, 1]
    n1  = rmsnorm(x)
    att = mla(n1, heads = heads, q_lora_rank = 1536, kv_lora_rank = 512, qk_nope_head_dim = 128,
              qk_rope_head_dim = 64, v_head_dim = 128{flash},
              rope_scaling = yarn(factor = 40, original_max_position_embeddings = 4096,
                                  mscale = 1, mscale_all_dim = 1)) @ [dp, 1, tp]
    o   = linear(att, hidden, bias = false) weight @ [tp, 1]
    output x + o
"""
NETWORK = """
    input tokens : [batch, seq] @ [dp, 1]
    emb    = embedding(tokens, vocab, hidden)
    body   = repeat decoder(emb) layers
    norm   = rmsnorm(body)
    logits = linear(norm, vocab, bias = false)
    output cross_entropy(logits, tokens)
"""


def v3_spec(flash: bool = False, recompute: str = "none") -> str:
    return spec_text(
        tp=t, layers=L, recompute=recompute, layer=MLA_LAYER.format(flash=", flash = true" * flash),
        network=NETWORK, dims=f"vocab = {V}\n hidden = {h}\n heads = {a}\n seq = {s}",
    )  # fmt: skip


def v3_estimate(**kwargs):
    result = checked(v3_spec(**kwargs))
    return estimate(Plan(result.spec, result.facts)), Plan(result.spec, result.facts)


def per_layer(**kwargs) -> int:
    (stage,) = v3_estimate(**kwargs)[0].stages
    return stage.activation_bytes_per_layer


def test_activation_memory_per_layer_is_the_hand_derivation():
    """Per layer and device, bf16 (2 bytes), sb = s * b tokens of the dp rank, heads a
    split over t: what backward reads in the generated code.

    - n1 = rmsnorm(x) keeps x: 2sbh.
    - mla keeps its input n1 (both down-projections' weight gradients): 2sbh; the q
      latent x W_q_a and its RMSNorm, whole on every tp rank (the norm's and q_b's
      backward): 2 * 2sb q_c; the kv latent and its norm: 2 * 2sb kv_c; q and k per
      head after rope (the shared rope key copied to each head): 2 * 2sb a d_qk / t;
      v: 2sb a d_v / t; the softmax probabilities: 2 a s^2 b / t.
    - o (row parallel) keeps its input, the attention output: 2sb a d_v / t.

    Sum: 4sbh + 4sb (q_c + kv_c) + (4sb a d_qk + 4sb a d_v + 2 a s^2 b) / t.
    With DeepSeek-V3's sizes: 117,440,512 (4sbh) + 33,554,432 (the latents) +
    50,331,648 (q, k) + 33,554,432 (v, att) + 536,870,912 (the probabilities) =
    771,751,936 bytes. The kv latent and its norm, 4sb kv_c = 8,388,608, are what the
    compression keeps; the per-head k and v the core needs, 41,943,040, are kept too.
    """
    sb = s * b
    want = 4 * sb * h + 4 * sb * (q_c + kv_c) + (4 * sb * a * d_qk + 4 * sb * a * d_v
                                                 + 2 * a * s * s * b) // t  # fmt: skip
    assert want == 771_751_936
    assert per_layer() == want


def test_with_flash_the_scores_give_way_to_the_kernels_statistics():
    """With flash the probabilities (2 a s^2 b / t) are not kept; the kernel keeps its
    output and reads v, both padded to d_qk (the kernel's one head size): v grows from
    2sb a d_v / t to 2sb a d_qk / t, the padded output adds 2sb a d_qk / t, and the fp32
    softmax max and sum add 2 * 4 a s b * 8 / t. Sum: 4sbh + 4sb (q_c + kv_c) +
    (8sb a d_qk + 2sb a d_v + 64 a s b) / t."""
    sb = s * b
    want = 4 * sb * h + 4 * sb * (q_c + kv_c) + (8 * sb * a * d_qk + 2 * sb * a * d_v
                                                 + 64 * a * s * b) // t  # fmt: skip
    assert per_layer(flash=True) == want


def test_select_recompute_of_the_op_keeps_its_input_and_output():
    """`select(att)`: mla is a composite op (one Cell): its input n1 and its output
    are kept, everything inside rerun: 2sbh (x) + 2sbh (n1) + 2sb a d_v / t (att)."""
    sb = s * b
    assert per_layer(recompute="select(att)") == 4 * sb * h + 2 * sb * a * d_v // t


def test_parameters_are_transformers_count_of_deepseek_v3_attention():
    """The op's parameters and o_proj's, per layer, equal the parameters of
    transformers' DeepseekV3Attention built with DeepSeek-V3's sizes (on the meta
    device: nothing allocated): 187,107,328 per layer."""
    torch = require("torch")
    transformers = require("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    config = transformers.DeepseekV3Config(
        hidden_size=h, num_attention_heads=a, num_key_value_heads=a, q_lora_rank=q_c,
        kv_lora_rank=kv_c, qk_nope_head_dim=n, qk_rope_head_dim=r, v_head_dim=d_v,
    )  # fmt: skip
    with torch.device("meta"):
        module = DeepseekV3Attention(config, layer_idx=0)
    per_layer_params = sum(p.numel() for p in module.parameters())
    assert per_layer_params == 187_107_328
    est, _ = v3_estimate()
    network = V * h + h + h * V  # embedding, final norm, output layer
    assert est.params_total == L * (per_layer_params + h) + network  # + n1's gamma


def test_model_flops_are_the_hand_count():
    """Per token, forward: 2 x (h q_c + q_c a d_qk + h (kv_c + r) + kv_c a (n + d_v)
    + a d_v h) for the five projections and o, and per sequence 2 a s^2 (d_qk + d_v)
    for QK^T and PV (every pair: Korthikanti's convention); backward twice forward,
    so a step is 3x, plus the output layer's 2 h V per token, 3x."""
    est, plan = v3_estimate()
    matrices = h * q_c + q_c * a * d_qk + h * (kv_c + r) + kv_c * a * (n + d_v) + a * d_v * h
    tokens = s * b
    per_layer = 2 * tokens * matrices + 2 * b * a * s * s * (d_qk + d_v)
    want = 3 * (L * per_layer + 2 * tokens * h * V)
    assert step_flops(plan).model == want


def test_heads_a_tp_split_would_cut_is_a_located_msl201(tmp_path):
    """mla over 3 heads with tp = 2: no tensor dim catches it (kv_b's 3 * 28 columns
    split in two are 42 each, 1.5 heads), the op's head count does: MSL201 at the
    mesh's tp line, naming the heads, with a hint; exit 1, no traceback."""
    text = SPECS["tiny_mla"].read_text().replace("mla(n1, heads = heads,", "mla(n1, heads = 3,")
    assert "heads = 3" in text
    spec = tmp_path / "tiny_mla.msl"
    spec.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "msgen.cli", "check", str(spec)], capture_output=True, text=True
    )
    assert done.returncode == 1, done.stderr
    assert "error[MSL201]: tp = 2 does not divide 3 (heads)" in done.stderr
    tp_line = text.splitlines().index("    tp = 2") + 1
    assert f":{tp_line}:5:" in done.stderr and "= hint:" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "change, code, message",
    [
        ("0.8)) @ [dp, 1, tp] q_a @ [1, tp]", "MSL210", "`q_a` of mla `att` is laid"),
        ("0.8)) @ [dp, 1, tp] q @ [1, tp]", "MSL209", "has no parameter `q`"),
        ("0.8), flash = true) @ [dp, 1, tp]", "MSL119", "a multiple of 16"),
        ("0.8, beta = 2)) @ [dp, 1, tp]", "MSL115", "no parameter `beta`"),
    ],
)
def test_what_the_op_refuses_is_located(change, code, message):
    """A weight split the op does not run, a parameter of the other q mode, flash over
    a head size FlashAttentionScore cannot take, a yarn parameter that is not one: each
    a diagnostic with its code, on the op's lines, with a hint."""
    text = SPECS["tiny_mla"].read_text()
    assert "0.8)) @ [dp, 1, tp]" in text
    text = text.replace("0.8)) @ [dp, 1, tp]", change)
    result = analyze_text(text, "tiny_mla.msl", SPECS["tiny_mla"].parent, [])
    (error,) = [d for d in result.diagnostics if d.is_error]
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if "att  = mla(" in line) + 1
    last = next(i for i, line in enumerate(lines) if "@ [dp, 1, tp]" in line) + 1
    assert error.code == code and first <= error.span.line <= last and message in error.message
    assert error.hint


def test_backward_all_reduces_the_up_projections_input_gradients_over_tp():
    """The up-projections are column parallel over tp: the gradient of each one's input
    is a partial sum over the heads (Megatron's ColumnParallelLinear all-reduces it in
    backward), and so is the shared rope key's (each rank sums its own heads' part):
    tokens x q_lora_rank for the q latent, tokens x (kv_lora_rank + qk_rope_head_dim)
    for the kv down-projection's output; forward needs none."""
    from msgen.analysis.facts import context
    from msgen.ops import OPS

    _, plan = v3_estimate()
    of = plan.graph("decoder").ops["att"]
    assert of.layout.collectives == ()
    back = OPS["mla"].backward_collectives(of.node, of.inputs, of.layout, context(plan.spec))
    tokens = s * b
    assert [(c.kind, c.axes, c.elements) for c in back] == [
        ("AllReduce", ("tp",), tokens * q_c),
        ("AllReduce", ("tp",), tokens * (kv_c + r)),
    ]


def test_the_heads_go_over_tp_unless_written():
    """Without `@ [...]` on the op its output is split as Megatron-Core splits MLA's
    heads: over tp, batch as x's; the same layout as tiny_mla's written `@ [dp, 1, tp]`."""
    text = SPECS["tiny_mla"].read_text()
    bare = text.replace("0.8)) @ [dp, 1, tp]", "0.8))")
    assert bare != text
    layouts = []
    for spec in (text, bare):
        result = analyze_text(spec, "tiny_mla.msl", SPECS["tiny_mla"].parent, [])
        assert result.ok
        layouts.append(result.facts.graphs["decoder"].ops["att"].layout)
    assert layouts[0] == layouts[1] and layouts[0].output == (("dp",), (), ("tp",))
