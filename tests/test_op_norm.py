"""layernorm and rmsnorm (msgen/ops/norm.py): their numpy references, the defaults
written as the papers and MindSpore's layers use them (not read from msgen), and what
the references must get right."""

from __future__ import annotations

import numpy as np


def layernorm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def rmsnorm(x, gamma, eps):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * gamma


REFERENCES = {
    "layernorm": lambda op: layernorm(
        op.inputs[0], op.param("gamma"), op.param("beta"), op.args.get("eps", 1e-5)
    ),
    "rmsnorm": lambda op: rmsnorm(op.inputs[0], op.param("gamma"), op.args.get("eps", 1e-6)),
}


def test_layernorm_gives_zero_mean_and_unit_variance_then_scales():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 5.0, (4, 16))
    out = layernorm(x, np.ones(16), np.zeros(16), 1e-12)
    np.testing.assert_allclose(out.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(out.var(-1), 1, rtol=1e-9)
    gamma, beta = rng.normal(size=16), rng.normal(size=16)
    np.testing.assert_allclose(layernorm(x, gamma, beta, 1e-12), out * gamma + beta)


def test_rmsnorm_keeps_the_mean_and_gives_unit_rms():
    """Unlike layernorm it does not centre: a constant row stays constant (Zhang &
    Sennrich 2019)."""
    x = np.full((2, 8), 4.0)
    np.testing.assert_allclose(rmsnorm(x, np.ones(8), 0.0), np.ones((2, 8)))
    rng = np.random.default_rng(1)
    y = rmsnorm(rng.normal(2.0, 3.0, (3, 32)), np.ones(32), 0.0)
    np.testing.assert_allclose(np.sqrt((y**2).mean(-1)), 1, rtol=1e-12)
