"""mla (msgen/ops/mla.py): its numpy reference, written from DeepSeek-V2's definition
(arXiv 2405.04434, eqs. 9-19: the q LoRA, the compressed kv latent, the decoupled rope
key shared by the heads; rope on pairs of channels as DeepSeek's own code rotates them,
complex multiplication), checked against transformers 4.57's DeepseekV3Attention and
DeepseekV2Attention on random weights; then the generated MLA cell run by MindSpore
against transformers with the same weights, q LoRA on and off; and mutations of the
reference that a plausible mistake would make, each seen by the comparison."""

from __future__ import annotations

import math

import numpy as np
import pytest

from msgen.ops.mla import dims, softmax_scale, yarn_mscale
from tests.oracles import require

# the tiny spec's sizes (tests/specs/tiny_mla.msl)
HIDDEN, HEADS, Q_LORA, KV_LORA, NOPE, ROPE, V, SEQ = 64, 4, 24, 16, 16, 8, 12, 32


def rmsnorm(x, gamma, eps=1e-6):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * gamma


def rope_pairs(x, theta, positions):
    """Rope on channel pairs (2i, 2i + 1) as complex numbers times e^{i m theta_i}:
    DeepSeek's apply_rotary_emb (x [..., seq, r])."""
    r = x.shape[-1]
    inv_freq = theta ** (-np.arange(0, r, 2) / r)
    angles = np.outer(positions, inv_freq)
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * angles)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def rope_halves(x, theta, positions):
    """Rotate-half rope (channel i with i + r/2): transformers' apply_rotary_pos_emb."""
    r = x.shape[-1]
    inv_freq = theta ** (-np.arange(0, r, 2) / r)
    angles = np.outer(positions, inv_freq)
    angles = np.concatenate([angles, angles], -1)
    rotated = np.concatenate([-x[..., r // 2 :], x[..., : r // 2]], -1)
    return x * np.cos(angles) + rotated * np.sin(angles)


def mla(x, p, heads, nope, rope, v, theta=10000.0, interleave=True, scale=None, eps=1e-6):
    """x [b, s, hidden] -> [b, s, heads * v]; p: q_a, q_norm, q_b (or q), kv_a,
    kv_norm, kv_b as [in, out] matrices and norm gammas."""
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
    q_pe = rotate(q[..., nope:], theta, np.arange(s))
    k_pe = rotate(k_pe[:, None], theta, np.arange(s))  # one key for every head
    scores = q[..., :nope] @ k_nope.transpose(0, 1, 3, 2) + q_pe @ k_pe.transpose(0, 1, 3, 2)
    scores = scores * (qk**-0.5 if scale is None else scale)
    scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return (probs @ value).transpose(0, 2, 1, 3).reshape(b, s, heads * v)


MATRICES = ("q", "q_a", "q_norm", "q_b", "kv_a", "kv_norm", "kv_b")


def reference(op):
    """Looks `mla` up when called, so a test may replace it."""
    d = dims(op.node)
    prefix = f"{op.prefix}{op.node.name}."
    params = {m: op.params[prefix + m] for m in MATRICES if prefix + m in op.params}
    return mla(
        op.inputs[0], params, d["heads"], d["nope"], d["rope"], d["v"],
        op.args.get("rope_theta", 10000.0), op.args.get("rope_interleave", True),
        softmax_scale(op.node), op.args.get("eps", 1e-6),
    )  # fmt: skip


REFERENCES = {"mla": reference}


def test_yarn_mscale_is_deepseeks():
    """yarn_get_mscale(40, 0.707) as DeepSeek-V2-Lite's config gives it, by hand:
    0.1 * 0.707 * ln 40 + 1 = 1.26081...; 1 without scaling."""
    assert yarn_mscale(40.0, 0.707) == pytest.approx(1.0 + 0.0707 * 3.6888794541139363)
    assert yarn_mscale(1.0, 1.0) == 1.0 and yarn_mscale(40.0, 0.0) == 1.0


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


@pytest.mark.parametrize(
    "version, q_lora, interleave",
    [("v3", True, True), ("v3", False, True), ("v3", True, False), ("v2", True, True),
     ("v2", False, True)],
)  # fmt: skip
def test_the_reference_equals_transformers_deepseek_attention(version, q_lora, interleave):
    """DeepseekV3Attention (rope interleaved by default, or rotate-half) and
    DeepseekV2Attention (complex rope) against the reference with their weights."""
    module, config, modeling = hf_module(version, q_lora, interleave)
    x = np.random.default_rng(2).normal(size=(2, SEQ, HIDDEN))
    want = hf_forward(version, module, config, modeling, x)
    got = mla(x, hf_params(module), HEADS, NOPE, ROPE, V, interleave=interleave)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_deepseek_v3_scales_the_softmax_by_mscale_squared():
    """With yarn's mscale_all_dim, DeepseekV3Attention's softmax scale is
    qk_head_dim^-0.5 * mscale^2 (factor 4, mscale_all_dim 1: mscale = 1 + 0.1 ln 4,
    by hand), and the op's scale is that one."""
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": SEQ,
               "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}  # fmt: skip
    module, config, modeling = hf_module("v3", True, rope_scaling=scaling)
    from msgen.ir.models import OpNode

    node = OpNode.model_construct(
        name="att", kind="mla", inputs=[],
        args={"heads": HEADS, "kv_lora_rank": KV_LORA, "qk_nope_head_dim": NOPE,
              "qk_rope_head_dim": ROPE, "v_head_dim": V, "rope_factor": 4.0,
              "mscale_all_dim": 1.0},
    )  # fmt: skip
    want = (NOPE + ROPE) ** -0.5 * (1 + 0.1 * math.log(4.0)) ** 2
    assert softmax_scale(node) == pytest.approx(want) == pytest.approx(module.scaling)
