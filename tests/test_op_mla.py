"""mla (msgen/ops/mla.py): its numpy reference, written from DeepSeek-V2's definition
(arXiv 2405.04434, eqs. 9-19: the q LoRA, the compressed kv latent, the decoupled rope
key shared by the heads; rope on pairs of channels as DeepSeek's own code rotates them,
complex multiplication), checked against transformers 4.57's DeepseekV3Attention and
DeepseekV2Attention on random weights; then the generated MLA cell run by MindSpore
against transformers with the same weights, q LoRA on and off; and mutations of the
reference that a plausible mistake would make, each seen by the comparison."""

from __future__ import annotations

import numpy as np
import pytest

from msgen.ir.models import Call, OpNode
from msgen.ops.attention import rope_scaling
from msgen.ops.mla import softmax_scale
from msgen.ops.mla_geometry import MlaGeometry
from msgen.ops.rope_scaling.frequencies import rope_frequencies
from tests.oracles import require

# the tiny spec's sizes (tests/specs/tiny_mla.msl)
HIDDEN, HEADS, Q_LORA, KV_LORA, NOPE, ROPE, V, SEQ = 64, 4, 24, 16, 16, 8, 12, 32


def rmsnorm(x, gamma, eps=1e-6):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * gamma


def frequencies(r, theta, scaling):
    """Inverse frequencies theta^(-2i/r) and the factor on cos and sin (1), or under a
    rope scaling (transformers' rope_scaling dict) msgen's one definition of them
    (msgen/ops/rope_scaling/frequencies.py, held to transformers by test_rope_scaling)."""
    if not scaling:
        return theta ** (-np.arange(0, r, 2) / r), 1.0
    return rope_frequencies(r, theta, scaling["rope_type"], scaling)


def rope_pairs(x, theta, positions, scaling=None):
    """Rope on channel pairs (2i, 2i + 1) as complex numbers times e^{i m theta_i}:
    DeepSeek's apply_rotary_emb (x [..., seq, r]), times the scaling's factor."""
    r = x.shape[-1]
    inv_freq, factor = frequencies(r, theta, scaling)
    angles = np.outer(positions, inv_freq)
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * angles) * factor
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def rope_halves(x, theta, positions, scaling=None):
    """Rotate-half rope (channel i with i + r/2): transformers' apply_rotary_pos_emb."""
    r = x.shape[-1]
    inv_freq, factor = frequencies(r, theta, scaling)
    angles = np.outer(positions, inv_freq)
    angles = np.concatenate([angles, angles], -1)
    rotated = np.concatenate([-x[..., r // 2 :], x[..., : r // 2]], -1)
    return (x * np.cos(angles) + rotated * np.sin(angles)) * factor


def mla(x, p, heads, nope, rope, v, theta=10000.0, interleave=True, scale=None, eps=1e-6,
        scaling=None):  # fmt: skip
    """x [b, s, hidden] -> [b, s, heads * v]; p: q_a, q_norm, q_b (or q), kv_a,
    kv_norm, kv_b as [in, out] matrices and norm gammas; `scaling`: a rope scaling as
    transformers' rope_scaling dict."""
    b, s, _ = x.shape
    qk = nope + rope
    if "q_a" in p:
        q = rmsnorm(x @ p["q_a"], p["q_norm"], eps) @ p["q_b"]
    else:
        q = x @ p["q"]
    q = q.reshape(b, s, heads, qk).transpose(0, 2, 1, 3)
    kv_a = x @ p["kv_a"]
    latent, k_pe = kv_a[..., :-rope], kv_a[..., -rope:]
    kv = (rmsnorm(latent, p["kv_norm"], eps) @ p["kv_b"]).reshape(b, s, heads, nope + v)
    kv = kv.transpose(0, 2, 1, 3)
    k_nope, value = kv[..., :nope], kv[..., nope:]
    rotate = rope_pairs if interleave else rope_halves
    q_pe = rotate(q[..., nope:], theta, np.arange(s), scaling)
    k_pe = rotate(k_pe[:, None], theta, np.arange(s), scaling)  # one key for every head
    scores = q[..., :nope] @ k_nope.transpose(0, 1, 3, 2) + q_pe @ k_pe.transpose(0, 1, 3, 2)
    scores = scores * (qk**-0.5 if scale is None else scale)
    scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return (probs @ value).transpose(0, 2, 1, 3).reshape(b, s, heads * v)


MATRICES = ("q", "q_a", "q_norm", "q_b", "kv_a", "kv_norm", "kv_b")


def reference(op):
    """Looks `mla` up when called, so a test may replace it."""
    g = MlaGeometry.of(op.node)
    prefix = f"{op.prefix}{op.node.name}."
    params = {m: op.params[prefix + m] for m in MATRICES if prefix + m in op.params}
    return mla(
        op.inputs[0], params, g.heads, g.nope, g.rope, g.v,
        op.args.get("rope_theta", 10000.0), op.args.get("rope_interleave", True),
        softmax_scale(op.node), op.args.get("eps", 1e-6), dict(rope_scaling(op.node) or ()),
    )  # fmt: skip


REFERENCES = {"mla": reference}


def node(**args) -> OpNode:
    """An mla op over the tiny spec's sizes, with `args` on top."""
    base = {"heads": HEADS, "kv_lora_rank": KV_LORA, "qk_nope_head_dim": NOPE,
            "qk_rope_head_dim": ROPE, "v_head_dim": V}  # fmt: skip
    return OpNode.model_construct(name="att", kind="mla", inputs=[], args=base | args)


def yarn(**params) -> Call:
    return Call.model_construct(name="yarn", args=params)


def test_the_softmax_scale_takes_deepseeks_mscale_squared():
    """DeepSeek-V2-Lite's yarn (factor 40, mscale_all_dim 0.707), by hand:
    mscale = 0.1 * 0.707 * ln 40 + 1 = 1.26080...; the scale (16 + 8)^-0.5 * mscale^2.
    None without an mscale_all_dim, or with yarn_mscale = false (transformers'
    DeepseekV2Attention)."""
    lite = yarn(factor=40, original_max_position_embeddings=4096, mscale_all_dim=0.707)
    mscale = 0.1 * 0.707 * 3.6888794541139363 + 1
    assert softmax_scale(node(rope_scaling=lite)) == pytest.approx(24**-0.5 * mscale**2)
    plain = yarn(factor=40, original_max_position_embeddings=4096)
    assert softmax_scale(node(rope_scaling=plain)) == 24**-0.5
    assert softmax_scale(node(rope_scaling=lite, yarn_mscale=False)) == 24**-0.5
    assert softmax_scale(node()) == 24**-0.5


def test_the_rope_layouts_give_the_same_scores_up_to_a_permutation():
    """Interleaved rope equals rotate-half rope on the channels permuted evens-then-odds
    (transformers' apply_rotary_pos_emb_interleave), so q.k is the same."""
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(2, 6, 8))
    perm = np.r_[0:8:2, 1:8:2]
    pos = np.arange(6)
    pairs = rope_pairs(q, 1e4, pos) @ rope_pairs(k, 1e4, pos).T
    halves = rope_halves(q[:, perm], 1e4, pos) @ rope_halves(k[:, perm], 1e4, pos).T
    np.testing.assert_allclose(pairs, halves, atol=1e-12)
    plain = rope_halves(q, 1e4, pos) @ rope_halves(k, 1e4, pos).T
    assert np.abs(plain - pairs).max() > 1e-3


def hf_module(version: str, q_lora: bool, interleave: bool = True, rope_scaling=None):
    """transformers' attention module with random weights (norms not ones), its config."""
    torch = require("torch")
    transformers = require("transformers")
    kwargs = dict(
        hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=HEADS,
        q_lora_rank=Q_LORA if q_lora else None, kv_lora_rank=KV_LORA,
        qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V, rope_theta=10000.0,
        max_position_embeddings=SEQ, attention_bias=False, rope_scaling=rope_scaling,
        attn_implementation="eager",
    )  # fmt: skip
    if version == "v3":
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as modeling

        config = transformers.DeepseekV3Config(rope_interleave=interleave, **kwargs)
        module = modeling.DeepseekV3Attention(config, layer_idx=0)
    else:
        from transformers.models.deepseek_v2 import modeling_deepseek_v2 as modeling

        config = transformers.DeepseekV2Config(**kwargs)
        module = modeling.DeepseekV2Attention(config, layer_idx=0)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.3)
        for norm in ("q_a_layernorm", "kv_a_layernorm"):
            if hasattr(module, norm):
                getattr(module, norm).weight.uniform_(0.5, 1.5)
    return module.eval(), config, modeling


def hf_forward(version, module, config, modeling, x):
    """The module's output before o_proj (o_proj made the identity on its input)."""
    torch = require("torch")
    rotary = getattr(modeling, f"Deepseek{version.upper()}RotaryEmbedding")(config)
    t = torch.tensor(x, dtype=torch.float32)
    position = rotary(t, torch.arange(x.shape[1])[None])
    mask = torch.full((x.shape[1],) * 2, float("-inf")).triu(1)[None, None]
    captured = {}
    hook = module.o_proj.register_forward_hook(lambda m, i, o: captured.setdefault("x", i[0]))
    with torch.no_grad():
        if version == "v3":
            module(t, position, mask)
        else:
            module(t, attention_mask=mask, position_embeddings=position)
    hook.remove()
    return captured["x"].numpy().astype(np.float64)


def hf_params(module) -> dict:
    """The module's weights as msgen lays them ([in, out])."""
    names = {"q_proj": "q", "q_a_proj": "q_a", "q_b_proj": "q_b", "kv_a_proj_with_mqa": "kv_a",
             "kv_b_proj": "kv_b", "q_a_layernorm": "q_norm", "kv_a_layernorm": "kv_norm"}  # fmt: skip
    out = {}
    for hf, ours in names.items():
        if hasattr(module, hf):
            w = getattr(module, hf).weight.detach().numpy().astype(np.float64)
            out[ours] = w if w.ndim == 1 else w.T
    return out


# yarn as DeepSeek-V3 sets it, the attention factor on cos and sin not 1 (mscale 1 over
# mscale_all_dim 0.8) and the softmax's mscale^2 not 1
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8}  # fmt: skip


@pytest.mark.parametrize(
    "version, q_lora, interleave, scaling",
    [("v3", True, True, None), ("v3", False, True, None), ("v3", True, False, None),
     ("v3", True, True, YARN), ("v3", False, True, YARN), ("v2", True, True, None),
     ("v2", False, True, None), ("v2", True, True, YARN)],
)  # fmt: skip
def test_the_reference_equals_transformers_deepseek_attention(version, q_lora, interleave,
                                                              scaling):  # fmt: skip
    """DeepseekV3Attention (rope interleaved by default, or rotate-half) and
    DeepseekV2Attention (complex rope) against the reference with their weights, with
    and without yarn: V3 scales the softmax by mscale^2, V2 (transformers 4.57) not."""
    module, config, modeling = hf_module(version, q_lora, interleave, scaling)
    x = np.random.default_rng(2).normal(size=(2, SEQ, HIDDEN))
    want = hf_forward(version, module, config, modeling, x)
    args = {}
    if scaling:
        params = {k: v for k, v in scaling.items() if k != "rope_type"}
        args = {"rope_scaling": yarn(**params), "yarn_mscale": version == "v3"}
    scale = softmax_scale(node(**args))
    assert scale == pytest.approx(module.scaling, rel=1e-12)
    got = mla(x, hf_params(module), HEADS, NOPE, ROPE, V, interleave=interleave, scale=scale,
              scaling=scaling)  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
