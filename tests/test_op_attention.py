"""attention (msgen/ops/attention.py): its numpy reference, written from the op's
definition (qkv laid out per kv group, rotate-half rope, causal and sliding-window
masks), and what that reference must get right. test_generated perturbs each feature
of it to show the forward comparison sees it."""

from __future__ import annotations

import math

import numpy as np

from msgen.ops.attention_geometry import head_dim, kv_heads
from msgen.ops.rope_scaling import resolved
from msgen.ops.rope_scaling.frequencies import rope_frequencies
from tests.oracles import require


def rope(x, theta=10000.0, scaling=None):
    """Rotate-half rotary embedding of x [batch, heads, seq, head_dim]; `scaling`, a
    (name, parameters) pair, takes the frequencies and the factor on cos and sin from
    msgen.ops.rope_scaling (held against transformers' in test_rope_scaling)."""
    seq, hd = x.shape[-2], x.shape[-1]
    if scaling:
        inv_freq, factor = rope_frequencies(hd, theta, *scaling)
    else:
        inv_freq, factor = theta ** (-np.arange(0, hd, 2) / hd), 1.0
    angles = np.outer(np.arange(seq), inv_freq.astype(np.float64))
    angles = np.concatenate([angles, angles], axis=-1)
    half = hd // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * np.cos(angles) + rotated * np.sin(angles)) * factor


def head_rmsnorm(x, gamma, eps=1e-6):
    """Qwen3's q/k norm: RMSNorm of each head's vector over head_dim."""
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * gamma


def attention(
    qkv, heads, groups, hd, causal, use_rope, theta=10000.0, window=None, qk=None, scaling=None
):
    """qkv laid out per kv group: the group's query heads, then its k, then its v;
    `window`: each position sees itself and the window - 1 before it; `qk`: the
    (q_norm, k_norm) gammas, applied per head before rope; `scaling`: rope's."""
    b, s, _ = qkv.shape
    per = heads // groups
    t = qkv.reshape(b, s, groups, per + 2, hd)
    q = t[:, :, :, :per, :].reshape(b, s, heads, hd).transpose(0, 2, 1, 3)
    k = t[:, :, :, per, :].transpose(0, 2, 1, 3)  # [b, groups, s, hd]
    v = t[:, :, :, per + 1, :].transpose(0, 2, 1, 3)
    if qk is not None:
        q, k = head_rmsnorm(q, qk[0]), head_rmsnorm(k, qk[1])
    if use_rope:
        q, k = rope(q, theta, scaling), rope(k, theta, scaling)
    k = np.repeat(k, per, axis=1)  # query head h uses group h // per
    v = np.repeat(v, per, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    if causal:
        seen = np.tril(np.ones((s, s), bool))
        if window:
            seen &= ~np.tril(np.ones((s, s), bool), -window)
        scores = np.where(seen, scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(-1, keepdims=True)
    out = probs @ v  # [b, heads, s, hd]
    return out.transpose(0, 2, 1, 3).reshape(b, s, heads * hd)


def reference(op):
    """Looks `attention` up when called, so a test may replace it."""
    args = op.args
    form = args.get("rope_scaling")
    return attention(
        op.inputs[0],
        args["heads"],
        kv_heads(op.node),
        head_dim(op.node, op.ctx),
        args.get("causal", False),
        args.get("rope", False),
        args.get("rope_theta", 10000.0),
        args.get("window"),
        (op.param("q_norm"), op.param("k_norm")) if args.get("qk_norm") else None,
        (form.name, resolved(form.name, form.args)) if form else None,
    )


REFERENCES = {"attention": reference}


def grouped(q, k, v):
    """qkv [b, s, groups * (per + 2) * hd] from q [b, s, heads, hd], k, v [b, s, groups, hd]."""
    b, s, heads, hd = q.shape
    groups = k.shape[2]
    q = q.reshape(b, s, groups, heads // groups, hd)
    return np.concatenate([q, k[:, :, :, None], v[:, :, :, None]], axis=3).reshape(b, s, -1)


def test_a_window_of_one_sees_only_its_own_position():
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, 5, n, 2)) for n in (4, 2, 2))
    out = attention(grouped(q, k, v), 4, 2, 2, causal=True, use_rope=False, window=1)
    want = np.repeat(v, 2, axis=2).reshape(1, 5, 8)  # each query head reads its group's v
    np.testing.assert_allclose(out, want)


def test_causal_attention_at_the_first_position_reads_only_the_first_value():
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(2, 4, n, 4)) for n in (2, 1, 1))
    out = attention(grouped(q, k, v), 2, 1, 4, causal=True, use_rope=True).reshape(2, 4, 2, 4)
    np.testing.assert_allclose(out[:, 0], np.repeat(v[:, 0], 2, axis=1))
    full = attention(grouped(q, k, v), 2, 1, 4, causal=False, use_rope=True).reshape(2, 4, 2, 4)
    assert np.abs(full[:, 0] - out[:, 0]).max() > 1e-3  # unmasked, later keys count


def test_rope_rotates_pairs_so_scores_depend_on_relative_position():
    """q_m . k_n after rope depends on m - n only (Su et al. 2021), and norms are kept."""
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=8), rng.normal(size=8)
    seq = 6
    qs = rope(np.tile(q, (1, 1, seq, 1)))[0, 0]
    ks = rope(np.tile(k, (1, 1, seq, 1)))[0, 0]
    np.testing.assert_allclose(np.linalg.norm(qs, axis=-1), np.linalg.norm(q))
    np.testing.assert_allclose(qs[3] @ ks[1], qs[5] @ ks[3])
    assert abs(qs[3] @ ks[1] - qs[3] @ ks[2]) > 1e-6


def test_qk_norm_gives_each_head_of_q_and_k_unit_rms_before_scoring():
    """With unit gammas, scaling a head's q or k leaves the output unchanged (the
    norm removes it), which plain attention does not; the gammas scale per channel."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(1, 4, n, 8)) for n in (2, 1, 1))
    ones = (np.ones(8), np.ones(8))
    base = attention(grouped(q, k, v), 2, 1, 8, causal=True, use_rope=True, qk=ones)
    scaled = attention(grouped(q * 5, k * 0.1, v), 2, 1, 8, causal=True, use_rope=True, qk=ones)
    np.testing.assert_allclose(scaled, base, rtol=1e-3)  # eps 1e-6 against rms^2 0.01
    plain = attention(grouped(q * 5, k * 0.1, v), 2, 1, 8, causal=True, use_rope=True)
    assert np.abs(plain - base).max() > 1e-3
    np.testing.assert_allclose(np.sqrt((head_rmsnorm(q, 1.0) ** 2).mean(-1)), 1, rtol=1e-5)


def test_qk_norm_attention_equals_transformers_qwen3_attention():
    """The reference with q/k norms, rope and grouped kv heads against Qwen3's own
    attention (transformers' modeling_qwen3.Qwen3Attention: q_norm and k_norm, RMSNorm
    over head_dim with eps 1e-6, before rope), its output projection the identity, on
    random weights and non-unit gammas, causal."""
    torch = require("torch")
    transformers = require("transformers")
    from transformers.models.qwen3 import modeling_qwen3

    heads, groups, hd, seq, theta = 4, 2, 8, 6, 10000.0
    hidden = heads * hd
    config = transformers.Qwen3Config(
        hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=groups,
        head_dim=hd, rope_theta=theta, rms_norm_eps=1e-6, attention_bias=False,
        max_position_embeddings=seq, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    module = modeling_qwen3.Qwen3Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.5)
        module.o_proj.weight.copy_(torch.eye(hidden))
    x = torch.randn(1, seq, hidden)
    rotary = modeling_qwen3.Qwen3RotaryEmbedding(config)
    cos, sin = rotary(x, torch.arange(seq)[None])
    mask = torch.full((seq, seq), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want = module(x, (cos, sin), mask)[0].numpy()

    def proj(linear, n):  # [1, seq, n, hd], as Hugging Face views it
        return (x @ linear.weight.T).detach().numpy().reshape(1, seq, n, hd)

    qkv = grouped(proj(module.q_proj, heads), proj(module.k_proj, groups),
                  proj(module.v_proj, groups))  # fmt: skip
    gammas = (module.q_norm.weight.detach().numpy(), module.k_norm.weight.detach().numpy())
    got = attention(qkv, heads, groups, hd, causal=True, use_rope=True, theta=theta, qk=gammas)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
