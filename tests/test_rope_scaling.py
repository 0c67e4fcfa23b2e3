"""RoPE scaling's frequencies (msgen/ops/rope_scaling) against transformers 4.57's own
`ROPE_INIT_FUNCTIONS` on the same configs: the inverse frequencies bit for bit in
float32, the attention factor exactly; and the parameter rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from msgen.compiler import analyze_text
from msgen.ops.rope_scaling import ScalingError, resolved
from msgen.ops.rope_scaling.frequencies import rope_frequencies

CASE_DIR = Path(__file__).resolve().parent / "cases"
LLAMA31 = dict(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)
CASES = [
    (None, {}),
    ("linear", {"factor": 4.0}),
    ("llama3", LLAMA31),
    # a short original context moves most bands into the blended middle
    ("llama3", dict(LLAMA31, factor=32.0, original_max_position_embeddings=64)),
    ("yarn", dict(factor=4.0, original_max_position_embeddings=32768)),
    (
        "yarn",
        dict(
            factor=4.0,
            original_max_position_embeddings=64,
            beta_fast=16.0,
            beta_slow=2.0,
            truncate=False,
        ),
    ),
    # DeepSeek-V3's: the attention factor from mscale and mscale_all_dim
    (
        "yarn",
        dict(factor=40.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=0.707),
    ),
    ("yarn", dict(factor=4.0, original_max_position_embeddings=4096, attention_factor=1.5)),
]


def transformers_frequencies(dim, theta, kind, params):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = None if kind is None else {"rope_type": kind, **params}
    config = LlamaConfig(
        hidden_size=4 * dim,
        num_attention_heads=4,
        head_dim=dim,
        rope_theta=theta,
        max_position_embeddings=params.get("original_max_position_embeddings", 4096),
        rope_scaling=scaling,
    )
    inv_freq, factor = ROPE_INIT_FUNCTIONS[kind or "default"](config, "cpu")
    return inv_freq.numpy(), factor


@pytest.mark.parametrize("dim,theta", [(128, 500000.0), (64, 10000.0), (16, 1e6)])
@pytest.mark.parametrize("kind,params", CASES)
def test_frequencies_equal_transformers_bit_for_bit(dim, theta, kind, params):
    want, want_factor = transformers_frequencies(dim, theta, kind, params)
    got, factor = rope_frequencies(dim, theta, kind, resolved(kind, params) if kind else None)
    assert got.dtype == np.float32 and got.shape == (dim // 2,)
    np.testing.assert_array_equal(got, want)
    assert factor == want_factor


def test_llama3_keeps_high_bands_divides_low_ones_and_blends_between():
    """Hand derivation, dim 16, theta 10^4, original context 64, low and high factors
    1 and 4: band i has wavelength 2 pi 10^(i / 2) = 6.3, 19.9, 62.8, 198.7, ...; below
    64 / 4 = 16 it is kept (i = 0), above 64 / 1 divided by the factor (i >= 3), the
    two between are blended."""
    params = dict(LLAMA31, original_max_position_embeddings=64)
    plain, _ = rope_frequencies(16, 1e4)
    scaled, _ = rope_frequencies(16, 1e4, "llama3", resolved("llama3", params))
    assert scaled[0] == plain[0]
    np.testing.assert_allclose(scaled[3:], plain[3:] / 8, rtol=1e-6)
    for i in (1, 2):
        assert plain[i] / 8 < scaled[i] < plain[i]


@pytest.mark.parametrize(
    "kind,given,key,words",
    [
        ("dynamic", {"factor": 2.0}, None, "not supported: dynamic NTK"),
        ("longrope", {}, None, "not supported: longrope"),
        ("ntk", {}, None, "unknown rope scaling `ntk`"),
        ("llama3", {"factor": 8.0}, None, "needs `low_freq_factor`"),
        (
            "yarn",
            {"factor": 4.0, "original_max_position_embeddings": 8, "betafast": 3.0},
            "betafast",
            "no parameter",
        ),
        ("linear", {"factor": 0.0}, "factor", "a positive number"),
        (
            "yarn",
            {"factor": 4.0, "original_max_position_embeddings": 8, "truncate": 1.0},
            "truncate",
            "`true` or `false`",
        ),
        ("llama3", dict(LLAMA31, high_freq_factor=1.0), "high_freq_factor", "high_freq_factor >"),
    ],
)
def test_refusals_name_the_scaling_or_the_parameter(kind, given, key, words):
    with pytest.raises(ScalingError) as caught:
        resolved(kind, given)
    assert words in str(caught.value)
    assert caught.value.key == key


ATTENTION = "att  = attention(qkv, heads = heads, causal = true) @ [dp, 1, tp]"


def checked(arguments: str):
    """tests/cases/base.msl with `arguments` added to its attention."""
    text = (CASE_DIR / "base.msl").read_text()
    assert text.count(ATTENTION) == 1
    spec = text.replace(ATTENTION, ATTENTION.replace("causal = true", f"causal = true{arguments}"))
    return analyze_text(spec, "spec.msl", CASE_DIR), spec


@pytest.mark.parametrize(
    "arguments, code, words, hint",
    [
        (", rope = true, rope_scaling = dynamic(factor = 2)", "MSL116", "`dynamic` is not", "yarn"),
        (", rope = true, rope_scaling = longrope", "MSL116", "`longrope` is not", "llama3"),
        (
            ", rope = true, rope_scaling = llama3(factor = 8)",
            "MSL115",
            "needs `low_freq",
            "llama3(",
        ),
        (", rope = true, rope_scaling = linear(factor = 0)", "MSL126", "positive", None),
        (
            ", rope = true, rope_scaling = yarn(factor = 2, beta = 1)",
            "MSL115",
            "no parameter",
            "yarn(",
        ),
        (", rope_scaling = linear(factor = 2)", "MSL119", "needs rope = true", None),
    ],
)
def test_a_scaling_msgen_does_not_take_is_a_located_diagnostic(arguments, code, words, hint):
    result, spec = checked(arguments)
    errors = [d for d in result.diagnostics if d.is_error]
    assert [d.code for d in errors] == [code], [(d.code, d.message) for d in errors]
    (found,) = errors
    assert words in found.message
    assert hint is None or hint in found.hint
    line = spec.splitlines()[found.span.line - 1]
    form = arguments.split("rope_scaling = ")[1]
    assert line[found.span.col - 1 :].startswith(form[:-1])  # at the form written


def test_a_written_scaling_checks_clean():
    result, _ = checked(
        ", rope = true, rope_scaling = yarn(factor = 4, original_max_position_embeddings = 64, truncate = false)"
    )
    assert not [d for d in result.diagnostics if d.is_error]
